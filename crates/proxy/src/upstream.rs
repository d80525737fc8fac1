//! The upstream's address: parsed once, shown without its credentials, and extended by path
//! segments, so that a client's path can never leave the upstream's base path.

use percent_encoding::percent_decode_str;
use reqwest::Url;

/// The upstream base URL (`https://api.openai.com/v1`), with whatever credentials it carries
/// (`user:pass@`, `?api-key=…`) kept for requests and never shown.
#[derive(Clone)]
pub struct Upstream {
    base: Url,
    shown: String,
    /// Credential texts of the URL (user name, password, query values), as written and
    /// decoded, replaced wherever an upstream error would show them.
    secrets: Vec<String>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

impl std::fmt::Display for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

/// What a shown URL holds in place of a credential.
const REDACTED: &str = "<redacted>";

impl Upstream {
    /// Parses an upstream base URL: http or https, with a host; a trailing slash is dropped.
    pub fn parse(text: &str) -> Result<Upstream, String> {
        let mut base = Url::parse(text.trim()).map_err(|e| e.to_string())?;
        if !matches!(base.scheme(), "http" | "https") {
            return Err("the scheme must be http or https".to_owned());
        }
        if base.host_str().is_none_or(str::is_empty) {
            return Err("the URL has no host".to_owned());
        }
        base.set_fragment(None);
        if let Ok(mut segments) = base.path_segments_mut() {
            segments.pop_if_empty();
        }
        let mut secrets = Vec::new();
        let mut keep = |s: &str| {
            for t in [
                s.to_owned(),
                percent_decode_str(s).decode_utf8_lossy().into_owned(),
            ] {
                if !t.is_empty() && !secrets.contains(&t) {
                    secrets.push(t);
                }
            }
        };
        keep(base.username());
        if let Some(p) = base.password() {
            keep(p);
        }
        if let Some(q) = base.query() {
            for pair in q.split('&') {
                if let Some((_, v)) = pair.split_once('=') {
                    keep(v);
                }
            }
        }
        // Longest first, so that a secret containing another is replaced whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        let mut shown = base.clone();
        // Removing credentials from an http(s) URL with a host cannot fail.
        let _ = shown.set_username("");
        let _ = shown.set_password(None);
        if base.query().is_some() {
            let names: Vec<String> = base.query_pairs().map(|(k, _)| k.into_owned()).collect();
            shown
                .query_pairs_mut()
                .clear()
                .extend_pairs(names.iter().map(|k| (k.as_str(), REDACTED)));
        }
        let shown = shown.as_str().trim_end_matches('/').to_owned();
        Ok(Upstream {
            base,
            shown,
            secrets,
        })
    }

    /// The URL as it may be shown to clients and written to logs: no user name, password or
    /// query values.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// The host, for the policy's backend overrides.
    pub fn host(&self) -> Option<&str> {
        self.base.host_str()
    }

    /// The URL of `segments` under the base path, with the base's query and then `query`
    /// (a client's, passed through). Each segment is one path segment, percent-encoded as
    /// needed: nothing in it can climb out of the base path.
    pub fn endpoint<'a>(
        &self,
        segments: impl IntoIterator<Item = &'a str>,
        query: Option<&str>,
    ) -> Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.extend(segments);
        }
        if let Some(q) = query.filter(|q| !q.is_empty()) {
            let merged = match url.query() {
                Some(base) if !base.is_empty() => format!("{base}&{q}"),
                _ => q.to_owned(),
            };
            url.set_query(Some(&merged));
        }
        url
    }

    /// The credential texts of the URL (user name, password, query values; as written and
    /// decoded), longest first.
    pub fn secrets(&self) -> &[String] {
        &self.secrets
    }

    /// `text` with every credential of the URL replaced, however short (for texts that may
    /// quote the URL itself, such as a connection error's).
    pub fn redact(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for s in &self.secrets {
            if out.contains(s.as_str()) {
                out = out.replace(s.as_str(), REDACTED);
            }
        }
        out
    }
}

/// The path segments of a model id taken from a request path (`gpt-4o`,
/// `meta-llama/Llama-3-8B`): each percent-decoded; `None` when one is empty, `.` or `..`
/// (as written or encoded), or is not UTF-8.
pub fn model_segments(raw: &str) -> Option<Vec<String>> {
    raw.split('/')
        .map(|s| {
            let decoded = percent_decode_str(s).decode_utf8().ok()?;
            let bad = decoded.is_empty()
                || decoded == "."
                || decoded == ".."
                || decoded.contains(['/', '\\']);
            (!bad).then(|| decoded.into_owned())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn credentials_are_never_shown() {
        let u = Upstream::parse("https://alice:s3cr%40t@llm.example.com/v1/?api-key=KEY123&x=1")
            .unwrap();
        assert_eq!(
            u.shown(),
            "https://llm.example.com/v1?api-key=%3Credacted%3E&x=%3Credacted%3E"
        );
        for s in ["alice", "s3cr%40t", "s3cr@t", "KEY123"] {
            assert!(!u.shown().contains(s), "{s} in {}", u.shown());
            assert!(!format!("{u} {u:?}").contains(s));
        }
        let err = "error sending request for url (https://alice:s3cr%40t@llm.example.com/v1/chat/completions?api-key=KEY123)";
        let red = u.redact(err);
        assert!(
            !red.contains("KEY123") && !red.contains("s3cr") && !red.contains("alice"),
            "{red}"
        );
    }

    #[test]
    fn a_query_in_the_upstream_stays_after_the_path() {
        let u = Upstream::parse(
            "https://res.openai.azure.com/openai/deployments/gpt?api-version=2024-06-01",
        )
        .unwrap();
        assert_eq!(
            u.endpoint(["chat", "completions"], None).as_str(),
            "https://res.openai.azure.com/openai/deployments/gpt/chat/completions?api-version=2024-06-01"
        );
        assert_eq!(
            u.endpoint(["models"], Some("limit=2")).as_str(),
            "https://res.openai.azure.com/openai/deployments/gpt/models?api-version=2024-06-01&limit=2"
        );
    }

    #[test]
    fn model_ids_cannot_climb_out_of_the_base_path() {
        for raw in [
            "..", "../../x", "%2e%2e/x", "%2E%2E", "a/./b", "a//b", "%2fetc", "a%5c..", "",
        ] {
            assert_eq!(model_segments(raw), None, "{raw}");
        }
        assert_eq!(
            model_segments("meta-llama/Llama-3-8B").unwrap(),
            ["meta-llama", "Llama-3-8B"]
        );
        let u = Upstream::parse("http://127.0.0.1:9/v1/").unwrap();
        let segs = model_segments("gpt%204o").unwrap();
        let mut all = vec!["models"];
        all.extend(segs.iter().map(String::as_str));
        assert_eq!(
            u.endpoint(all, None).as_str(),
            "http://127.0.0.1:9/v1/models/gpt%204o"
        );
    }
}
