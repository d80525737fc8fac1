//! When to ask the judge: never before `first_turn` turns of the current prompt, then every
//! `initial_interval` turns until the first answer, then at an interval that adapts to the last
//! confidence: `round(min + (max - min) × (1 − c))` — 5 turns at full confidence, 15 at none.

/// The numbers of the schedule, all policy parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Schedule {
    /// The first turn (of the current prompt) at which a check may run.
    pub first_turn: u64,
    /// Turns between checks until a check has answered.
    pub initial_interval: u64,
    /// Interval at confidence 1.
    pub min_interval: u64,
    /// Interval at confidence 0.
    pub max_interval: u64,
}

impl Default for Schedule {
    fn default() -> Schedule {
        Schedule {
            first_turn: 30,
            initial_interval: 3,
            min_interval: 5,
            max_interval: 15,
        }
    }
}

impl Schedule {
    /// Turns until the next check after an answer with this confidence.
    pub fn interval_after(&self, confidence: f64) -> u64 {
        let c = if confidence.is_finite() {
            confidence.clamp(0.0, 1.0)
        } else {
            0.0
        };
        let span = self.max_interval.saturating_sub(self.min_interval) as f64;
        (self.min_interval as f64 + span * (1.0 - c)).round() as u64
    }
}

/// Where one session stands in the schedule.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Clock {
    /// Assistant turns since the current prompt (the last user message).
    pub turn: u64,
    /// The turn at which the next check is due, once one has answered; before that the
    /// schedule's initial cadence applies.
    next_due: Option<u64>,
    /// The turn of the last check started.
    last_check: Option<u64>,
}

impl Clock {
    /// A new user prompt: the count starts again.
    pub fn new_prompt(&mut self) {
        *self = Clock::default();
    }

    /// One more assistant turn; says whether a check is due at it.
    pub fn next_turn(&mut self, s: &Schedule) -> bool {
        self.turn += 1;
        self.due(s)
    }

    /// Whether a check is due at the current turn (and none started at this turn yet).
    pub fn due(&self, s: &Schedule) -> bool {
        if self.turn < s.first_turn || self.last_check == Some(self.turn) {
            return false;
        }
        match self.next_due {
            Some(t) => self.turn >= t,
            None => {
                let every = s.initial_interval.max(1);
                (self.turn - s.first_turn).is_multiple_of(every)
            }
        }
    }

    /// A check starts at the current turn.
    pub fn started(&mut self) {
        self.last_check = Some(self.turn);
    }

    /// A check that started at `turn` answered with `confidence` (`None`: it failed, and the
    /// cadence stays as it was).
    pub fn answered(&mut self, s: &Schedule, turn: u64, confidence: Option<f64>) {
        if let Some(c) = confidence {
            self.next_due = Some(turn + s.interval_after(c));
        }
    }

    /// The turn the next check is due at (`None`: the first check's turn).
    #[cfg(test)]
    pub fn next_due(&self) -> Option<u64> {
        self.next_due
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn clock_at(turn: u64) -> Clock {
        Clock {
            turn,
            ..Clock::default()
        }
    }

    #[test]
    fn no_check_before_turn_30_then_every_3() {
        let s = Schedule::default();
        assert!(!clock_at(29).due(&s));
        assert!(clock_at(30).due(&s));
        assert!(!clock_at(31).due(&s));
        assert!(!clock_at(32).due(&s));
        assert!(clock_at(33).due(&s));
        let mut c = Clock::default();
        let due: Vec<u64> = (0..40)
            .filter_map(|_| c.next_turn(&s).then_some(c.turn))
            .collect();
        assert_eq!(due, [30, 33, 36, 39]);
    }

    #[test]
    fn interval_adapts_to_confidence() {
        let s = Schedule::default();
        assert_eq!(s.interval_after(1.0), 5);
        assert_eq!(s.interval_after(0.0), 15);
        assert_eq!(s.interval_after(0.85), 7); // 5 + 1.5 = 6.5 → 7
        assert_eq!(s.interval_after(0.9), 6);
        assert_eq!(s.interval_after(0.89), 6); // 6.1 → 6
        assert_eq!(s.interval_after(f64::NAN), 15);
        assert_eq!(s.interval_after(7.0), 5);
    }

    #[test]
    fn an_answer_sets_the_next_check() {
        let s = Schedule::default();
        let mut c = clock_at(30);
        assert!(c.due(&s));
        c.started();
        assert!(!c.due(&s), "one check per turn");
        c.answered(&s, 30, Some(0.85));
        assert_eq!(c.next_due(), Some(37));
        for t in 31..37 {
            c.turn = t;
            assert!(!c.due(&s), "turn {t}");
        }
        c.turn = 37;
        assert!(c.due(&s));
    }

    #[test]
    fn a_failed_check_keeps_the_cadence_and_a_new_prompt_restarts() {
        let s = Schedule::default();
        let mut c = clock_at(30);
        c.started();
        c.answered(&s, 30, None);
        c.turn = 33;
        assert!(c.due(&s));
        c.new_prompt();
        assert_eq!(c.turn, 0);
        assert!(!c.due(&s));
    }
}
