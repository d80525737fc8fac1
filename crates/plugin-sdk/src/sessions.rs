//! Per-session state with a bound on how many sessions are remembered.

use std::collections::HashMap;

/// A plugin's state per session, for at most `capacity` sessions: when a new session arrives
/// and the map is full, the least recently seen session is forgotten.
///
/// Eviction scans the map (`O(capacity)`), and happens only when a new session arrives while
/// the map is full; every other access is one hash lookup.
#[derive(Debug)]
pub struct Sessions<T> {
    map: HashMap<String, (u64, T)>,
    capacity: usize,
    tick: u64,
}

impl<T: Default> Sessions<T> {
    /// An empty map that remembers at most `capacity` sessions (at least one).
    pub fn new(capacity: usize) -> Sessions<T> {
        Sessions {
            map: HashMap::new(),
            capacity: capacity.max(1),
            tick: 0,
        }
    }

    /// The state of session `id`, created (with `T::default()`) if it is not remembered, and
    /// marked as the most recently seen.
    pub fn get(&mut self, id: &str) -> &mut T {
        self.tick += 1;
        let tick = self.tick;
        if !self.map.contains_key(id) {
            if self.map.len() >= self.capacity {
                let oldest = self
                    .map
                    .iter()
                    .min_by_key(|(_, (seen, _))| *seen)
                    .map(|(k, _)| k.clone());
                if let Some(oldest) = oldest {
                    self.map.remove(&oldest);
                }
            }
            self.map.insert(id.to_owned(), (tick, T::default()));
        }
        let (seen, state) = self
            .map
            .get_mut(id)
            .unwrap_or_else(|| unreachable!("inserted above"));
        *seen = tick;
        state
    }
}

impl<T> Sessions<T> {
    /// Forgets session `id` (e.g. on a reset).
    pub fn remove(&mut self, id: &str) -> Option<T> {
        self.map.remove(id).map(|(_, s)| s)
    }

    /// The state of session `id` if it is remembered, without marking it as seen.
    pub fn peek(&self, id: &str) -> Option<&T> {
        self.map.get(id).map(|(_, s)| s)
    }

    /// How many sessions are remembered.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no session is remembered.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Every remembered session's state, in no particular order.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.map.values_mut().map(|(_, s)| s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_seen_session_is_forgotten_first() {
        let mut s: Sessions<u32> = Sessions::new(2);
        *s.get("a") = 1;
        *s.get("b") = 2;
        assert_eq!(*s.get("a"), 1); // a is now more recent than b
        *s.get("c") = 3; // full: b goes
        assert_eq!(s.len(), 2);
        assert_eq!(*s.get("a"), 1);
        assert_eq!(*s.get("c"), 3);
        assert_eq!(s.remove("b"), None);
    }

    #[test]
    fn remove_forgets_and_capacity_is_at_least_one() {
        let mut s: Sessions<u32> = Sessions::new(0);
        *s.get("a") = 7;
        assert_eq!(*s.get("a"), 7);
        *s.get("b") = 8;
        assert_eq!(s.len(), 1);
        assert_eq!(s.remove("b"), Some(8));
        assert!(s.is_empty());
    }
}
