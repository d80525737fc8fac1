//! Secrets never leave the process: API keys, bearer tokens and credential assignments in the
//! history are replaced with `[REDACTED]` before a check is sent.

use std::sync::OnceLock;

use regex::Regex;

const PATTERNS: &[&str] = &[
    // Provider keys: OpenAI/Anthropic-style `sk-…`, GitHub, Slack, AWS access key ids, Google.
    r"\bsk-[A-Za-z0-9_\-]{16,}",
    r"\bgh[pousr]_[A-Za-z0-9]{20,}",
    r"\bxox[abposr]-[A-Za-z0-9\-]{10,}",
    r"\bAKIA[0-9A-Z]{16}\b",
    r"\bAIza[0-9A-Za-z_\-]{30,}",
    // Authorization headers and bearer tokens.
    r"(?i)\bbearer\s+[A-Za-z0-9._~+/\-]{8,}=*",
    r"(?i)\bbasic\s+[A-Za-z0-9+/]{12,}=*",
    // JSON web tokens.
    r"\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",
    // key=value / key: value where the key names a credential.
    r#"(?i)\b([A-Z0-9_]*(?:api[_\-]?key|secret|token|password|passwd|access[_\-]?key)[A-Z0-9_]*)["']?\s*[:=]\s*["']?[^\s"',;]{6,}"#,
    // PEM private keys.
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----",
];

fn patterns() -> &'static [Regex] {
    static RE: OnceLock<Vec<Regex>> = OnceLock::new();
    RE.get_or_init(|| PATTERNS.iter().filter_map(|p| Regex::new(p).ok()).collect())
}

/// `text` with every secret-like string replaced by `[REDACTED]` (a credential assignment keeps
/// its key name so the judge still sees what was set).
pub fn mask_secrets(text: &str) -> String {
    let mut out = text.to_owned();
    for (i, re) in patterns().iter().enumerate() {
        if !re.is_match(&out) {
            continue;
        }
        out = if i == 8 {
            re.replace_all(&out, "$1=[REDACTED]").into_owned()
        } else {
            re.replace_all(&out, "[REDACTED]").into_owned()
        };
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn every_pattern_compiles() {
        assert_eq!(patterns().len(), PATTERNS.len());
    }

    #[test]
    fn secrets_are_masked_and_prose_is_not() {
        for (input, secret) in [
            (
                "key sk-ant-api03-AbCdEfGhIjKlMnOpQrStUv done",
                "AbCdEfGhIjKlMnOp",
            ),
            (
                "Authorization: Bearer eyJhbGciOi.abcdefghijk.lmnopqrstu",
                "abcdefghijk",
            ),
            (
                "token ghp_0123456789abcdefghijABCDEFGHIJ",
                "0123456789abcdef",
            ),
            ("AWS AKIAIOSFODNN7EXAMPLE here", "IOSFODNN7"),
            ("DB_PASSWORD=hunter2hunter2", "hunter2"),
            ("\"api_key\": \"abcd1234efgh5678\"", "abcd1234efgh"),
            (
                "-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----",
                "MIIEow",
            ),
        ] {
            let masked = mask_secrets(input);
            assert!(!masked.contains(secret), "{input} → {masked}");
            assert!(masked.contains("[REDACTED]"), "{input} → {masked}");
        }
        let prose = "The tokenizer splits the password field; see skeleton-key.md";
        assert_eq!(mask_secrets(prose), prose);
        assert!(mask_secrets("DB_PASSWORD=hunter2hunter2").starts_with("DB_PASSWORD="));
    }
}
