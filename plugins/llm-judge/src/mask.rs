//! Secrets never leave the process: everything the judge reads passes through [`mask_secrets`]
//! first, which replaces what looks like a credential with `[REDACTED]`.
//!
//! # Rules, in the order they apply
//!
//! 1. **Private keys**: PEM blocks (`-----BEGIN … PRIVATE KEY-----` to the matching `END`).
//! 2. **Provider key shapes**, whole: OpenAI/Anthropic `sk-…`/`sk-ant-…`, Stripe
//!    `sk_live_`/`sk_test_`/`rk_live_`/`rk_test_`, GitHub `ghp_`/`gho_`/`ghu_`/`ghs_`/`ghr_` and
//!    `github_pat_`, GitLab `glpat-`, Hugging Face `hf_`, Slack `xox[abposr]-`, AWS access key
//!    ids `AKIA…`/`ASIA…`, Google `AIza…`, SendGrid `SG.….…`, npm `npm_`, and JSON web tokens
//!    (`eyJ….….…`).
//! 3. **URL userinfo**: `scheme://user:password@` keeps the scheme and becomes
//!    `scheme://[REDACTED]@`.
//! 4. **Authorization headers and schemes**: `Authorization: <scheme> <credential>` (any scheme:
//!    `Bearer`, `Basic`, `Token`, `Digest`, …), and `Bearer …`/`Basic …` anywhere; the header and
//!    scheme names stay.
//! 5. **Password flags**: `--password X`, `--password=X` (also `--passwd`, `--pass`, `--token`,
//!    `--secret`, `--api-key`, `--access-key`), and the attached `-pX` of the MySQL/MariaDB
//!    clients (only on a line that runs one of them: elsewhere `-p…` is usually a compiler flag
//!    or a package name).
//! 6. **Credential assignments**: `key=value`, `key: value`, `"key": "value"`, `'key': 'value'`
//!    and escaped JSON inside a JSON string (`\"key\": \"value\"`), where the key names a
//!    credential: it contains `password`, `passwd`, `pwd`, `secret`, `token`, `api_key`/`apikey`,
//!    `access_key`, `private_key`, `private_key_id`, `client_secret`, `AccountKey` or
//!    `SharedAccessKey` (any case, any prefix such as `DB_` or `x-`), as a whole word of the key:
//!    `max_tokens` and `tokenizer` are not credentials. The key and its quotes stay; values of
//!    any length are masked (`password=abc1` too).
//! 7. **High-entropy tokens**: a run of at least 24 characters of `[A-Za-z0-9+/_-]` (with
//!    trailing `=`) that has letters and digits and a Shannon entropy of at least 3 bits per
//!    character, and then:
//!    - hex only: masked (API keys often are hex; UUIDs too), except at exactly 40 or 64
//!      characters, the SHA-1 and SHA-256 object ids of git, which are hashes and left alone;
//!    - otherwise masked when at least 45% of neighbouring letters and digits change class
//!      (lower case, upper case, digit: about 60% in random base62), or at least 25% and
//!      words cover less than half of its letters and digits. Words are the camelCase pieces of
//!      its letter runs that are acronyms (3–5 capitals) or 4+ letters with a quarter vowels.
//!
//!    So identifiers and paths (`src/module_017/handlers/request_validation`,
//!    `TestParseConfigWithEnvironmentOverrides2`) stay, and random keys (base62, base64) go; a
//!    test checks that at most 1% of random tokens with letters and digits are kept.
//!
//! Every pattern is compiled once, by the `regex` crate, whose matching is linear in the text.

use std::sync::LazyLock;

use regex::{Captures, Regex};

/// What replaces a secret.
pub const REDACTED: &str = "[REDACTED]";

/// The shape of a key name that holds a credential (rule 6). A secret word must end the key or
/// be followed by a separator, so `max_tokens` or `tokenizer` are not credentials.
const KEY: &str = r"(?:[A-Za-z0-9]+[_.\-])*[A-Za-z0-9]*(?:password|passwd|pwd|secret|token|api[_\-]?key|access[_\-]?key|private[_\-]?key(?:[_\-]?id)?|client[_\-]?secret|accountkey|sharedaccesskey)(?:[_.\-][A-Za-z0-9]+)*";

/// How a match of a rule is replaced.
#[derive(Clone, Copy)]
enum Replace {
    /// The whole match becomes [`REDACTED`].
    Whole,
    /// A replacement template that keeps the captured key names, separators and quotes.
    Keep(&'static str),
    /// The match is a candidate token, masked when [`looks_random`] says so.
    IfRandom,
}

/// One masking rule: a pattern and how a match is replaced.
struct Rule {
    re: Regex,
    replace: Replace,
}

fn rule(pattern: &str, replace: Replace) -> Option<Rule> {
    Regex::new(pattern).ok().map(|re| Rule { re, replace })
}

/// How many rules there are (a test checks that every one compiled).
#[cfg(test)]
const RULES: usize = 23;

static RULE_SET: LazyLock<Vec<Rule>> = LazyLock::new(|| {
    use Replace::{IfRandom, Keep, Whole};
    let key_rules = [
        // Escaped JSON inside a JSON string: {\"password\": \"x\"}.
        format!(r#"(?i)(\b{KEY}\\"\s*:\s*\\")((?:[^"\\]|\\[^"])*)(\\")"#),
        // "key": "value", key="value".
        format!(r#"(?i)(\b{KEY}"?\s*[:=]\s*")((?:[^"\\]|\\.)*)(")"#),
        // 'key': 'value', key='value'.
        format!(r#"(?i)(\b{KEY}'?\s*[:=]\s*')([^']*)(')"#),
        // key=value, key: value (unquoted).
        format!(r#"(?i)(\b{KEY}["']?\s*[:=][ \t]*)([^\s"'\\,;&]+)()"#),
    ];
    let mut rules: Vec<Option<Rule>> = vec![
        // 1. PEM private keys.
        rule(
            r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----",
            Whole,
        ),
        // 2. Provider key shapes.
        rule(r"\bsk-(?:ant-|proj-)?[A-Za-z0-9_\-]{16,}", Whole),
        rule(r"\b[rs]k_(?:live|test)_[A-Za-z0-9]{10,}", Whole),
        rule(r"\bgh[pousr]_[A-Za-z0-9]{20,}", Whole),
        rule(r"\bgithub_pat_[A-Za-z0-9_]{20,}", Whole),
        rule(r"\bglpat-[A-Za-z0-9_\-]{20,}", Whole),
        rule(r"\bhf_[A-Za-z0-9]{20,}", Whole),
        rule(r"\bxox[abposr]-[A-Za-z0-9\-]{10,}", Whole),
        rule(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b", Whole),
        rule(r"\bAIza[0-9A-Za-z_\-]{30,}", Whole),
        rule(r"\bSG\.[A-Za-z0-9_\-]{16,}\.[A-Za-z0-9_\-]{16,}", Whole),
        rule(r"\bnpm_[A-Za-z0-9]{30,}", Whole),
        rule(
            r"\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",
            Whole,
        ),
        // 3. URL userinfo with a password.
        rule(
            r#"(?i)\b([a-z][a-z0-9+.\-]*://)[^\s/?#@"'\\:]*:[^\s/?#@"'\\]+@"#,
            Keep("${1}[REDACTED]@"),
        ),
        // 4. Authorization headers (any scheme), then bare Bearer / Basic credentials.
        rule(
            r#"(?i)(\b(?:proxy-)?authorization\\?"?\s*[:=]\s*\\?"?(?:[A-Za-z\-]+\s+)?)([^\s"'\\,;]+)"#,
            Keep("${1}[REDACTED]"),
        ),
        rule(
            r"(?i)(\b(?:bearer|basic)\s+)([A-Za-z0-9._~+/\-]{8,}=*)",
            Keep("${1}[REDACTED]"),
        ),
        // 5. Password flags, then MySQL's attached `-pX` on a line running a MySQL client.
        rule(
            r#"(?i)(--(?:password|passwd|pass|token|secret|api-key|access-key)(?:=|[ \t]+))("[^"]*"|'[^']*'|[^\s"'\\]+)"#,
            Keep("${1}[REDACTED]"),
        ),
        rule(
            r#"(?i)(\b(?:mysql|mysqldump|mysqladmin|mysqlimport|mysqlshow|mysqlcheck|mariadb|mariadb-dump)\b[^\n]*?\s-p)([^\s"'\\]+)"#,
            Keep("${1}[REDACTED]"),
        ),
    ];
    // 6. Credential assignments: the key, separator and quotes stay.
    rules.extend(
        key_rules
            .iter()
            .map(|p| rule(p, Keep("${1}[REDACTED]${3}"))),
    );
    // 7. High-entropy tokens: candidates here, the decision in `looks_random`.
    rules.push(rule(r"[A-Za-z0-9+/_\-]{24,}=*", IfRandom));
    rules.into_iter().flatten().collect()
});

/// Shannon entropy of `s`, in bits per byte.
fn entropy(s: &[u8]) -> f64 {
    let mut counts = [0u32; 256];
    for &b in s {
        counts[usize::from(b)] += 1;
    }
    let n = s.len() as f64;
    counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = f64::from(c) / n;
            -p * p.log2()
        })
        .sum()
}

/// How many letters of `s` are in words: runs of letters are split camelCase-wise
/// (`parseHTTPResponse` → `parse`, `HTTP`, `Response`); a piece counts when it is an acronym
/// (three to five capitals) or has four letters or more, a quarter of them vowels.
fn word_bytes(s: &[u8]) -> usize {
    let mut covered = 0;
    let (mut piece, mut upper, mut vowels) = (0, true, 0);
    for (i, &c) in s.iter().enumerate() {
        if !c.is_ascii_alphabetic() {
            covered += word(piece, upper, vowels);
            (piece, upper, vowels) = (0, true, 0);
            continue;
        }
        let prev = i.checked_sub(1).and_then(|j| s.get(j)).copied();
        let next = s.get(i + 1).copied();
        let boundary = c.is_ascii_uppercase()
            && prev.is_some_and(|p| {
                p.is_ascii_lowercase()
                    || (p.is_ascii_uppercase() && next.is_some_and(|n| n.is_ascii_lowercase()))
            });
        if boundary {
            covered += word(piece, upper, vowels);
            (piece, upper, vowels) = (0, true, 0);
        }
        piece += 1;
        upper &= c.is_ascii_uppercase();
        vowels += usize::from(b"aeiouyAEIOUY".contains(&c));
    }
    covered + word(piece, upper, vowels)
}

/// The letters a piece of `len` letters with `vowels` vowels (`upper`: all capitals) counts as
/// words: words have vowels, random letters seldom (a fifth of the alphabet).
fn word(len: usize, upper: bool, vowels: usize) -> usize {
    let acronym = upper && (3..=5).contains(&len);
    if acronym || (len >= 4 && !upper && vowels * 4 >= len) {
        len
    } else {
        0
    }
}

/// The share of neighbouring letters and digits that change class (lower case, upper case,
/// digit): about 0.6 in random base62, under 0.3 in identifiers, whose words run in one case.
fn class_changes(s: &[u8]) -> f64 {
    let class = |c: u8| match c {
        b'a'..=b'z' => Some(0),
        b'A'..=b'Z' => Some(1),
        b'0'..=b'9' => Some(2),
        _ => None,
    };
    let (mut pairs, mut changes) = (0u32, 0u32);
    for w in s.windows(2) {
        if let (Some(a), Some(b)) = (class(w[0]), class(w[1])) {
            pairs += 1;
            changes += u32::from(a != b);
        }
    }
    if pairs == 0 {
        0.0
    } else {
        f64::from(changes) / f64::from(pairs)
    }
}

/// Rule 7: whether a candidate token looks like a random credential rather than a word, a
/// path, an identifier or a hash.
fn looks_random(token: &str) -> bool {
    let b = token.trim_end_matches('=').as_bytes();
    if b.len() < 24 {
        return false;
    }
    let letters = b.iter().any(u8::is_ascii_alphabetic);
    let digits = b.iter().any(u8::is_ascii_digit);
    if !letters || !digits {
        return false;
    }
    if entropy(b) < 3.0 {
        return false;
    }
    if b.iter().all(u8::is_ascii_hexdigit) {
        // Git object ids (SHA-1, SHA-256) are hashes; other long hex strings are often keys.
        return b.len() != 40 && b.len() != 64;
    }
    let changes = class_changes(b);
    if changes >= 0.45 {
        return true;
    }
    // Identifiers and paths change class less often and are made of words: those must not
    // cover half of the letters and digits (separators are structure).
    let alnum = b.iter().filter(|c| c.is_ascii_alphanumeric()).count();
    changes >= 0.25 && word_bytes(b) * 2 < alnum
}

/// `text` with every secret-like string replaced by `[REDACTED]` (see the module docs for the
/// rules; a credential assignment keeps its key name so the judge still sees what was set).
pub fn mask_secrets(text: &str) -> String {
    let mut out = text.to_owned();
    for r in RULE_SET.iter() {
        if !r.re.is_match(&out) {
            continue;
        }
        let replaced = match r.replace {
            Replace::Whole => r.re.replace_all(&out, REDACTED),
            Replace::Keep(template) => r.re.replace_all(&out, template),
            Replace::IfRandom => r.re.replace_all(&out, |c: &Captures<'_>| {
                let token = c.get(0).map_or("", |m| m.as_str());
                if looks_random(token) {
                    REDACTED.to_owned()
                } else {
                    token.to_owned()
                }
            }),
        };
        out = replaced.into_owned();
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn every_rule_compiles() {
        assert_eq!(RULE_SET.len(), RULES);
    }

    /// Real-looking secrets in the places they turn up: each must be masked, and the masked
    /// text must not contain the secret.
    const SECRETS: &[(&str, &str)] = &[
        // (text, the secret in it)
        (
            "key sk-ant-api03-AbCdEfGhIjKlMnOpQrStUv done",
            "AbCdEfGhIjKlMnOpQrStUv",
        ),
        (
            "OPENAI_KEY sk-proj-abcdefghijklmnopqrstuvwxyz0123456789",
            "abcdefghijklmnopqrstuvwxyz0123456789",
        ),
        (
            "stripe key: sk_live_51HqLyjWDarjtT1zdp7dcXYZabc",
            "51HqLyjWDarjtT1zdp7dcXYZabc",
        ),
        (
            "rk_live_4eC39HqLyjWDarjtT1zdp7dc",
            "4eC39HqLyjWDarjtT1zdp7dc",
        ),
        (
            "curl https://api.stripe.com -u sk_test_4eC39HqLyjWDarjtT1zdp7dc:",
            "4eC39HqLyjWDarjtT1zdp7dc",
        ),
        (
            "postgres://app_user:S3cr3t-pw@db.internal:5432/app",
            "S3cr3t-pw",
        ),
        (
            "redis://:hunter22@cache:6379/0 and https://bob:pa55word@example.com/x",
            "pa55word",
        ),
        ("mysqldump --password hunter2 appdb", "hunter2"),
        ("psql --password=Tr0ub4dor&3 -h db", "Tr0ub4dor&3"),
        ("mysql -u root -pS3cretPass appdb", "S3cretPass"),
        (
            "hub key hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123 loaded",
            "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123",
        ),
        (
            "export GITLAB=glpat-xY3zAbC9dEfGhIjKlMn0",
            "glpat-xY3zAbC9dEfGhIjKlMn0",
        ),
        (
            r#"{"body": "{\"user\": \"ann\", \"password\": \"correct horse\"}"}"#,
            "correct horse",
        ),
        (r#"{"args":"{\"password\":\"x9\"}"}"#, "x9"),
        (
            "Authorization: Token 9944b09199c62bcf9418ad846dd0e4bb",
            "9944b09199c62bcf9418ad846dd0e4bb",
        ),
        (
            "Authorization: Bearer eyJhbGciOi.abcdefghijk.lmnopqrstu",
            "abcdefghijk",
        ),
        (
            "authorization: Basic YWxhZGRpbjpvcGVuc2VzYW1l",
            "YWxhZGRpbjpvcGVuc2VzYW1l",
        ),
        ("password=abc1", "abc1"),
        ("DB_PASSWORD=hunter2hunter2", "hunter2hunter2"),
        (
            r#""private_key_id": "d41d8cd98f00b204e9800998ecf8427e1c2b3a4f""#,
            "d41d8cd98f00b204e9800998ecf8427e1c2b3a4f",
        ),
        (
            "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=Zm9vYmFyYmF6cXV4Zm9vYmFyYmF6cXV4==;EndpointSuffix=core.windows.net",
            "Zm9vYmFyYmF6cXV4Zm9vYmFyYmF6cXV4",
        ),
        (
            "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=root;SharedAccessKey=q1w2e3r4t5y6u7i8o9p0",
            "q1w2e3r4t5y6u7i8o9p0",
        ),
        (
            "SENDGRID=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",
            "ngeVfQFYQlKU0ufo8x5d1A",
        ),
        (
            "token ghp_0123456789abcdefghijABCDEFGHIJ",
            "0123456789abcdefghijABCDEFGHIJ",
        ),
        (
            "gho_16C7e42F292c6912E7710c838347Ae178B4a",
            "16C7e42F292c6912E7710c838347Ae178B4a",
        ),
        (
            "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz",
            "11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz",
        ),
        (
            "SLACK xoxb-17653672481-19874698323-pdFZKVeTuE8sk7oOcBrzbqgy",
            "pdFZKVeTuE8sk7oOcBrzbqgy",
        ),
        ("AWS AKIAIOSFODNN7EXAMPLE here", "AKIAIOSFODNN7EXAMPLE"),
        (
            "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        ),
        (
            "the key is wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY ok",
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        ),
        (
            "maps AIzaSyDaGmWKa4JsXZ-HjGw7ISLn_3namBGewQe",
            "AIzaSyDaGmWKa4JsXZ-HjGw7ISLn_3namBGewQe",
        ),
        (
            "//registry.npmjs.org/:_authToken=npm_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
            "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
        ),
        (
            "NPM npm_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
            "npm_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
        ),
        (
            "cookie eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
            "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        ),
        ("\"api_key\": \"abcd1234efgh5678\"", "abcd1234efgh5678"),
        ("client_secret='Qz8-vL2~pX9.rT4'", "Qz8-vL2~pX9.rT4"),
        ("GITHUB_TOKEN: ghs_notreallyashape", "ghs_notreallyashape"),
        ("pwd=Summer2024!", "Summer2024!"),
        ("X-Api-Key: 7f3a9c2e1b4d", "7f3a9c2e1b4d"),
        (
            "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7\n-----END RSA PRIVATE KEY-----",
            "MIIEowIBAAKCAQEA7",
        ),
        ("{\"secret\":\"s\"} and then", "\"s\""),
        (
            "session 4f9Kq2LmZx8Rt7Vb3Nc6Hy1Pd5Wj0Ga",
            "4f9Kq2LmZx8Rt7Vb3Nc6Hy1Pd5Wj0Ga",
        ),
    ];

    #[test]
    fn common_secret_shapes_are_masked() {
        assert!(SECRETS.len() >= 30);
        for (input, secret) in SECRETS {
            let masked = mask_secrets(input);
            assert!(
                !masked.contains(secret),
                "leaked `{secret}`: {input} → {masked}"
            );
            assert!(masked.contains(REDACTED), "{input} → {masked}");
        }
    }

    #[test]
    fn key_names_stay_so_the_judge_sees_what_was_set() {
        assert_eq!(
            mask_secrets("DB_PASSWORD=hunter2hunter2"),
            "DB_PASSWORD=[REDACTED]"
        );
        assert_eq!(
            mask_secrets(r#"{"password": "abc", "user": "ann"}"#),
            r#"{"password": "[REDACTED]", "user": "ann"}"#
        );
        assert_eq!(
            mask_secrets(r#"{\"password\":\"x\"}"#),
            r#"{\"password\":\"[REDACTED]\"}"#
        );
        assert_eq!(
            mask_secrets("psql postgres://app:pw1@db/app"),
            "psql postgres://[REDACTED]@db/app"
        );
        assert_eq!(
            mask_secrets("Authorization: Token abc123def"),
            "Authorization: Token [REDACTED]"
        );
        assert_eq!(
            mask_secrets("mysql -u root -pS3cret db"),
            "mysql -u root -p[REDACTED] db"
        );
    }

    /// Ordinary text the judge must read as it is.
    const ORDINARY: &[&str] = &[
        "The tokenizer splits the password field; see skeleton-key.md",
        "cargo test -p loopguard-tests --test plugins -- --nocapture",
        "gcc -pthread -pedantic -O2 main.c -o main",
        "mkdir -p build/output && cd build/output",
        "src/module_017/handlers/request_validation.rs:42: error[E0308]: mismatched types",
        "/usr/lib/x86_64-linux-gnu/libssl.so.3 not found",
        "commit 3f786850e387550fdab836ed7e6dc881de23001b (HEAD -> main)",
        "sha256 e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855 empty.txt",
        "usage: {\"prompt_tokens\": 1234, \"completion_tokens\": 56, \"max_tokens\": 4096}",
        "fn parse_config_with_environment_overrides_v2() -> Result<Config, Error>",
        "TestParseConfigWithEnvironmentOverrides2 passed in 0.03s",
        "https://docs.rs/regex/1.10.4/regex/struct.Regex.html#method.replace_all",
        "The password reset flow sends an email; the secret sauce is caching.",
        "ERROR: relation \"users\" does not exist at character 15",
        "Downloaded serde_json v1.0.117 and tokio-macros v2.2.0",
        "node_modules/@typescript-eslint/parser/dist/index.js",
        "AVeryLongCamelCaseIdentifierWithoutAnyDigitsInIt",
        "base64 of hello is aGVsbG8= which is short",
        "Bearer tokens are described in RFC 6750.",
    ];

    #[test]
    fn ordinary_text_is_left_alone() {
        for text in ORDINARY {
            assert_eq!(mask_secrets(text), *text);
        }
    }

    #[test]
    fn the_entropy_rule_leaves_hashes_and_words() {
        assert!(!looks_random("3f786850e387550fdab836ed7e6dc881de23001b"));
        assert!(!looks_random("module_017/handlers/request_validation"));
        assert!(looks_random("4f9Kq2LmZx8Rt7Vb3Nc6Hy1Pd5Wj0Ga"));
        assert!(looks_random("a94a8fe5ccb19ba61c4c0873d391e987"));
        assert!(
            !looks_random("aaaaaaaaaaaaaaaaaaaaaaaaaaaa1"),
            "low entropy"
        );
        assert!(!looks_random("TestParseConfigWithEnvironmentOverrides2"));
        assert!(!looks_random(
            "x86_64-unknown-linux-gnu/release/build/libfoo2"
        ));
    }

    /// Random tokens of the alphabets keys use are masked (a fixed-seed generator, so the check
    /// is deterministic).
    #[test]
    fn random_tokens_are_masked() {
        const ALPHABETS: [&[u8]; 3] = [
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/",
            b"0123456789abcdef",
        ];
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let (mut total, mut missed) = (0, Vec::new());
        for alphabet in ALPHABETS {
            for len in [24usize, 32, 48] {
                for _ in 0..200 {
                    let token: String = (0..len)
                        .map(|_| char::from(alphabet[(next() % alphabet.len() as u64) as usize]))
                        .collect();
                    total += 1;
                    if mask_secrets(&format!("value {token} end")).contains(&token) {
                        missed.push(token);
                    }
                }
            }
        }
        // Only tokens that happen to lack digits (or letters) may pass.
        let unlucky = missed
            .iter()
            .filter(|t| {
                t.bytes().any(|b| b.is_ascii_digit()) && t.bytes().any(|b| b.is_ascii_alphabetic())
            })
            .count();
        assert!(
            unlucky * 100 <= total,
            "{unlucky} of {total} random tokens kept: {missed:?}"
        );
    }

    #[test]
    fn large_text_is_masked_in_linear_time() {
        // Long runs that almost match: every rule must stay linear.
        let text = format!(
            "{}{}{}",
            "password".repeat(50_000),
            "a1".repeat(200_000),
            "\\\"".repeat(100_000)
        );
        let start = std::time::Instant::now();
        let _ = mask_secrets(&text);
        assert!(start.elapsed() < std::time::Duration::from_secs(20));
    }
}
