#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test code: failing loudly is the point

//! `loopctl proxy --require-key`: a request bound for the upstream that carries no API key is
//! a 401 in its format's error shape and nothing else is done with it; with a key, or without
//! the option, requests are served as always. The real binary between a scripted upstream on
//! 127.0.0.1 and an ordinary HTTP client.

mod support;

use serde_json::{Value, json};
use support::*;

/// Text in every request's body and session header: a refusal never quotes it.
const MARKER: &str = "marker-7f3a-never-echoed";

/// One wire format: its route, the route's label in `/metrics`, and the header (with a key)
/// its clients send.
struct Format {
    path: &'static str,
    route: &'static str,
    key: (&'static str, &'static str),
}

const FORMATS: [Format; 3] = [
    Format {
        path: "/v1/chat/completions",
        route: "chat_completions",
        key: ("authorization", "Bearer sk-chat-caller-0123"),
    },
    Format {
        path: "/v1/messages",
        route: "messages",
        key: ("x-api-key", "sk-ant-caller-0123"),
    },
    Format {
        path: "/v1/responses",
        route: "responses",
        key: ("api-key", "azure-caller-0123"),
    },
];

/// A request of format `f` for the scripted `text` model, plain or streamed, with [`MARKER`]
/// in its body and session header, carrying `headers` besides.
fn request(
    p: &Proxy,
    f: &Format,
    stream: bool,
    content: &str,
    headers: &[(&str, &str)],
) -> reqwest::RequestBuilder {
    let say = json!([{"role": "user", "content": format!("{content} {MARKER}")}]);
    let body = match f.route {
        "messages" => json!({"model": "text", "stream": stream, "max_tokens": 16,
            "messages": say, "metadata": {"user_id": MARKER}}),
        "responses" => json!({"model": "text", "stream": stream, "input": say, "user": MARKER}),
        _ => json!({"model": "text", "stream": stream, "messages": say, "user": MARKER}),
    };
    let mut r = client()
        .post(p.url(f.path))
        .header("x-session-id", MARKER)
        .json(&body);
    if f.route == "messages" {
        r = r.header("anthropic-version", "2023-06-01");
    }
    for (name, value) in headers {
        r = r.header(*name, *value);
    }
    r
}

/// Asserts that `r` refuses a request for carrying no key: a 401 with code `missing_api_key`
/// in the error shape of Anthropic's API (`anthropic`) or OpenAI's, quoting nothing of the
/// request.
async fn assert_refused(r: reqwest::Response, anthropic: bool, what: &str) {
    let status = r.status().as_u16();
    let header = |name: &str| {
        r.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let (content_type, challenge) = (header("content-type"), header("www-authenticate"));
    let text = r.text().await.unwrap();
    let what = format!("{what}: {status} {text}");
    assert_eq!(status, 401, "{what}");
    assert_eq!(content_type, "application/json", "{what}");
    assert_eq!(challenge, "Bearer", "{what}");
    assert!(!text.contains(MARKER), "{what}");
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(body["error"]["code"], "missing_api_key", "{what}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("requires an API key"), "{what}");
    if anthropic {
        assert_eq!(body["type"], "error", "{what}");
        assert_eq!(body["error"]["type"], "authentication_error", "{what}");
    } else {
        assert!(body.get("type").is_none(), "{what}");
        assert_eq!(body["error"]["type"], "invalid_request_error", "{what}");
    }
}

/// Asserts that `r` is the scripted `text` model's answer in format `f`, whole or streamed
/// to its last event.
async fn assert_served(r: reqwest::Response, f: &Format, stream: bool, what: &str) {
    let status = r.status().as_u16();
    let content_type = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let text = r.text().await.unwrap();
    let what = format!("{what}: {status} {text}");
    assert_eq!(status, 200, "{what}");
    if stream {
        assert!(content_type.starts_with("text/event-stream"), "{what}");
        let last = match f.route {
            "messages" => "event: message_stop",
            "responses" => "event: response.completed",
            _ => "data: [DONE]",
        };
        assert!(text.contains(last), "{what}");
    } else {
        let body: Value = serde_json::from_str(&text).unwrap();
        assert!(body.to_string().contains("The answer is 42"), "{what}");
    }
}

async fn healthz_sessions(p: &Proxy) -> u64 {
    let r = client().get(p.url("/healthz")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    r.json::<Value>().await.unwrap()["sessions"]
        .as_u64()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn requests_without_a_key_are_refused_in_their_format_and_never_reach_the_upstream() {
    let up = Upstream::start().await;
    let (p, _dir) = start(&up, 3, &["--require-key", "--allow-chat-commands"]);
    for f in &FORMATS {
        for stream in [false, true] {
            let r = request(&p, f, stream, "say hi", &[]).send().await.unwrap();
            let what = format!("{} stream={stream}", f.path);
            assert_refused(r, f.route == "messages", &what).await;
        }
    }
    // Headers that hold no key are no key: empty, blank, or a scheme alone (what a client
    // with an empty key sends).
    let chat = &FORMATS[0];
    let empty: [&[(&str, &str)]; 4] = [
        &[("authorization", "Bearer ")],
        &[("authorization", "")],
        &[("x-api-key", "   ")],
        &[("authorization", "Basic"), ("api-key", "")],
    ];
    for headers in empty {
        let r = request(&p, chat, false, "say hi", headers)
            .send()
            .await
            .unwrap();
        assert_refused(r, false, &format!("{headers:?}")).await;
    }
    // An in-chat command is not answered, even where everyone may use them.
    let r = request(&p, chat, false, "!/set(tool-loop-detection=false)", &[])
        .send()
        .await
        .unwrap();
    assert_refused(r, false, "a command").await;
    // The routes passed through to the upstream need a key too, each refused in its API's
    // shape: the model list (Anthropic's when the client says it is one), Anthropic's token
    // count, stored Responses.
    let passed: [(&str, &str, bool, bool); 5] = [
        ("GET", "/v1/models", false, false),
        ("GET", "/v1/models/text", false, false),
        ("GET", "/v1/models", true, true),
        ("POST", "/v1/messages/count_tokens", true, true),
        ("GET", "/v1/responses/resp_1", false, false),
    ];
    for (method, path, anthropic_client, anthropic) in passed {
        let mut r = client().request(method.parse().unwrap(), p.url(path));
        if anthropic_client {
            r = r.header("anthropic-version", "2023-06-01");
        }
        if method == "POST" {
            r = r
                .json(&json!({"model": "text", "messages": [{"role": "user", "content": MARKER}]}));
        }
        let r = r.send().await.unwrap();
        assert_refused(r, anthropic, &format!("{method} {path}")).await;
    }
    // A path the proxy does not serve is still a 404: it never reaches the upstream anyway.
    let r = client()
        .post(p.url("/v1/embeddings"))
        .json(&json!({"input": MARKER}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    assert_eq!(up.hits(), 0, "the upstream saw a request without a key");
    // Nothing was judged or kept; the proxy's own routes need no key and count each refusal.
    assert_eq!(healthz_sessions(&p).await, 0);
    let m = metrics(&p).await;
    for (route, n) in [
        ("chat_completions", 2 + 4 + 1),
        ("messages", 2),
        ("responses", 2),
        ("models", 3),
        ("passthrough", 2),
    ] {
        let series = format!(
            "loopguard_proxy_requests_refused_total{{route=\"{route}\",reason=\"missing_api_key\"}}"
        );
        assert_eq!(metric(&m, &series), Some(n), "{series}\n{m}");
    }
    assert_eq!(
        metric(&m, "loopguard_proxy_requests_total{route=\"messages\"}"),
        Some(2),
        "{m}"
    );
    assert_eq!(metric(&m, "loopguard_proxy_tool_calls_total"), Some(0));
    assert!(!p.log().contains(MARKER), "{}", p.log());
}

#[tokio::test(flavor = "multi_thread")]
async fn requests_with_a_key_are_served_as_without_the_option() {
    let up = Upstream::start().await;
    let (p, _dir) = start(&up, 3, &["--require-key"]);
    for f in &FORMATS {
        for stream in [false, true] {
            let r = request(&p, f, stream, "say hi", &[f.key])
                .send()
                .await
                .unwrap();
            assert_served(r, f, stream, &format!("{} stream={stream}", f.path)).await;
        }
    }
    assert_eq!(up.hits(), 6);
    let sent = up.received("messages");
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[0].headers["x-api-key"], FORMATS[1].key.1);
    // A route passed through, with a key.
    let r = client()
        .get(p.url("/v1/models"))
        .header("authorization", "Bearer sk-chat-caller-0123")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(up.hits(), 7);
    assert!(healthz_sessions(&p).await > 0);
    let m = metrics(&p).await;
    assert!(
        !m.contains("loopguard_proxy_requests_refused_total{"),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn without_the_option_requests_without_a_key_are_served() {
    let up = Upstream::start().await;
    let (p, _dir) = start(&up, 3, &[]);
    for f in &FORMATS {
        for stream in [false, true] {
            let r = request(&p, f, stream, "say hi", &[]).send().await.unwrap();
            assert_served(r, f, stream, &format!("{} stream={stream}", f.path)).await;
        }
    }
    let r = client().get(p.url("/v1/models")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(up.hits(), 7);
}
