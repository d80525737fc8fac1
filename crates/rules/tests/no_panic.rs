#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test code: failing loudly is the point

//! No input makes the rules crate panic: random text, and shipped policies mutated at random.

use std::path::Path;

use loopguard_rules::Policy;
use proptest::prelude::*;

const SHIPPED: &[&str] = &[
    include_str!("../../../rules/default.yaml"),
    include_str!("../../../rules/strict.yaml"),
    include_str!("../../../rules/nudge.yaml"),
    include_str!("../../../rules/proxy.yaml"),
];

/// Loads and, when valid, resolves and renders, exercising every stage.
fn exercise(text: String) {
    let loaded = Policy::load_text(Path::new("fuzz.yaml"), text);
    for d in &loaded.diagnostics {
        let _ = loaded.sources.render(d);
        let _ = loaded.sources.to_json(d);
    }
    if let Some(policy) = loaded.policy {
        let _ = policy.resolve(Some("openai"), Some("gpt-4o-mini"));
    }
}

fn mutate(text: &str, edits: &[(usize, u8, u8)]) -> String {
    let mut bytes = text.as_bytes().to_vec();
    for &(pos, kind, byte) in edits {
        if bytes.is_empty() {
            break;
        }
        let at = pos % bytes.len();
        const ALPHABET: &[u8] = b" :-[]{}&*!|>'\"#\n\t0a{}%@`";
        let byte = ALPHABET[byte as usize % ALPHABET.len()];
        match kind % 4 {
            0 => bytes[at] = byte,
            1 => bytes.insert(at, byte),
            2 => {
                bytes.remove(at);
            }
            _ => {
                let end = (at + 40).min(bytes.len());
                let chunk = bytes[at..end].to_vec();
                bytes.splice(at..at, chunk);
            }
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn random_text_never_panics(text in "(?s).{0,400}") {
        exercise(text);
    }

    #[test]
    fn yaml_shaped_text_never_panics(text in "(version: 1\n)?([a-z_]{1,12}: ?(\\{|\\[|[0-9]{1,4}|'[^']{0,8}'|\n  )[a-z_:, \\]\\}0-9-]{0,20}\n){0,12}") {
        exercise(text);
    }

    #[test]
    fn mutated_policies_never_panic(
        which in 0..SHIPPED.len(),
        edits in proptest::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..12),
    ) {
        exercise(mutate(SHIPPED[which], &edits));
    }
}
