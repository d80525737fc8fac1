#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use super::reference::{mask_trying_every_byte, outcome_plain, sketch_plain};
use super::*;

/// A tool's successful result with no exit code (as chat transcripts and the proxy carry them).
fn plain_result(output: &str) -> ToolResult<'_> {
    ToolResult {
        session: "s",
        call_id: "c",
        output,
        is_error: false,
        exit_code: None,
        time_ms: 0,
    }
}

fn all() -> Maskers {
    Maskers {
        ansi: true,
        timestamps: true,
        uuids: true,
        hex_ids: true,
        pids: true,
        durations: true,
        counters: true,
        temp_paths: true,
        ids: true,
    }
}

proptest::proptest! {
    /// Passing over bytes and words that start nothing changes nothing.
    #[test]
    fn skipping_masks_as_trying_every_byte(
        parts in proptest::collection::vec(proptest::sample::select(&[
            "2024-05-01T12:34:56.123Z", "12:34:56", "123e4567-e89b-12d3-a456-426614174000",
            "deadbeef42", "pid 1234", "PID: 9", "12.3s", "45 ms", "3 times", "(3/10)", "#7",
            "/tmp/abc", "req-7f3a9c", "msg_01H8XK2", "attempt 2", "retry #3", "run 9",
            "took_ms: 132", "id=88", "\x1b[31m", "\x1b]0;t\x07", "é", "µs", "5µs", "word",
            "a_b", "x1", " ", "  ", "\n", ".", "-", "_", "/", "(", "#", ":", "=", "\"", "0x1F2E3D4C",
            "build", "1200px", "v0.1.0", "abc123def456",
        ][..]), 0..40),
    ) {
        let s: String = parts.concat();
        let m = all();
        proptest::prop_assert_eq!(mask(&m, &s), mask_trying_every_byte(&m, &s));
    }
}

#[test]
fn masks_noise() {
    let m = all();
    let cases = [
        ("\x1b[31merror\x1b[0m: x", "error: x"),
        ("at 2024-05-01T12:34:56.123Z done", "at <ts> done"),
        ("at 2024-05-01 12:34:56+02:00 done", "at <ts> done"),
        ("time 09:15:01 ok", "time <ts> ok"),
        ("id 123e4567-e89b-12d3-a456-426614174000.", "id <uuid>."),
        ("commit deadbeef42 ok", "commit <hex> ok"),
        ("started pid 1234, PID: 99", "started pid <n>, pid <n>"),
        (
            "Nov 29 host app[2211]: refused",
            "Nov 29 host app[<pid>]: refused",
        ),
        (
            "GET http://127.0.0.1:54321/health: refused; localhost:8080 ok",
            "GET http://127.0.0.1:<port>/health: refused; localhost:8080 ok",
        ),
        (
            "[::1]:61234 localhost:50000",
            "[::1]:<port> localhost:<port>",
        ),
        ("src/big.c:40213: error", "src/big.c:40213: error"),
        (
            "In [7]: x\nOut[7]: 2\nCell In[7], line 3; Win[7]",
            "In [<n>]: x\nOut[<n>]: 2\nCell In[<n>], line 3; Win[7]",
        ),
        (
            "Time:        2.345 s, estimated 3 s; Time: 00:01.234, Memory: 24.00 MB",
            "Time:        <dur>, estimated <dur>; Time: <ts>, Memory: 24.00 MB",
        ),
        (
            "failed 2 hours ago, up 3 days, age 4m55s, ran 1h2m3.5s",
            "failed <dur> ago, up <dur>, age <dur>, ran <dur>",
        ),
        (
            "took 12.3s and 45ms, 3 seconds",
            "took <dur> and <dur>, <dur>",
        ),
        (
            "read 5 times (3/10) attempt 2",
            "read <n> times (<n>/<n>) attempt <n>",
        ),
        ("wrote /tmp/xyz123/out.txt", "wrote /tmp/<tmp>/out.txt"),
        (
            "[exec #7 exit=0 elapsed=0.01s]",
            "[exec #<n> exit=0 elapsed=<dur>]",
        ),
        (
            r#"{"message_id": "om_x100b8f06f1dcb1f8", "took_ms": 132, "seq": 4}"#,
            r#"{"message_id": "<id>", "took_ms": <n>, "seq": <n>}"#,
        ),
        ("id msg_01H8XK2ZQW9 messageId=77", "id <id> messageId=<n>"),
        ("Process Group PGID: 48213", "Process Group pid <n>"),
        ("REVISION: 14", "revision <n>"),
        (
            "64.9/64.9 kB 1.2 MB/s eta 0:00:00; 850KiB/s; 10/10 [00:01<00:00, 9.52it/s]",
            "64.9/64.9 kB <rate> eta <ts>; <rate>; 10/10 [<ts><<ts>, <rate>]",
        ),
        ("12 MB/sec 3 MB/s2 4 Mbps", "12 MB/sec 3 MB/s2 4 Mbps"),
        ("10:30 a<b 10:30", "10:30 a<b 10:30"),
        (
            "Using --randomly-seed=48213; seed: 7",
            "Using --randomly-seed=<n>; seed: <n>",
        ),
    ];
    for (input, want) in cases {
        assert_eq!(mask(&m, input), want, "{input:?}");
    }
}

#[test]
fn keeps_meaning() {
    let m = all();
    for s in [
        "error[E0425]: cannot find value `x` in this scope",
        "HTTP 503 Service Unavailable",
        "line 42: unexpected token",
        "héllo wörld — ünïcode 12",
        "facade accepted",
        "viewport top now at 1200px, 64GiB free",
        "python3 x86_64 v2 utf8",
        r#"{"count": 17, "port": 8080, "status": "processing"}"#,
    ] {
        assert_eq!(mask(&m, s), s);
    }
}

#[test]
fn classification() {
    let loaded = loopguard_rules::Policy::builtin_default();
    let c = loaded.policy.unwrap().resolve(None, None);
    let r = ResultRules::from_config(&c);
    let res = |output: &'static str, is_error: bool, exit_code: Option<i32>| ToolResult {
        session: "s",
        call_id: "c",
        output,
        is_error,
        exit_code,
        time_ms: 0,
    };
    let a = r.outcome(&res("done in 12ms at 2024-01-01T00:00:00Z", false, None));
    let b = r.outcome(&res("done in 99ms at 2025-02-02T10:00:00Z", false, None));
    assert_eq!(a.digest, b.digest);
    assert!(!a.error && !a.empty && !a.retryable);
    assert!(r.outcome(&res("  \n", false, None)).empty);
    assert!(r.outcome(&res("No matches found.", false, None)).empty);
    assert!(r.outcome(&res("x", false, Some(2))).error);
    assert!(!r.outcome(&res("x", false, Some(0))).error);
    let rl = r.outcome(&res("HTTP 429 Too Many Requests", true, None));
    assert!(rl.error && rl.retryable);
    // A successful output that mentions 500 is not retryable.
    assert!(!r.outcome(&res("total 500", false, None)).retryable);
}

/// Infrastructure trouble is said where a client or a harness says it, at either end of a
/// failure, and a status with what makes it one; a status the output quotes in between (a
/// task's text, a page) or compares (`assert 503 == 200`) is no such trouble.
#[test]
fn a_failure_is_retryable_by_what_its_ends_say() {
    let loaded = loopguard_rules::Policy::builtin_default();
    let c = loaded.policy.unwrap().resolve(None, None);
    let r = ResultRules::from_config(&c);
    let failed = |output: &str| r.outcome(&plain_result(output)).retryable;
    for text in [
        "HTTP 429 Too Many Requests",
        "Error: status code 502 from upstream",
        "curl: (28) Failed to connect to api.example.com port 443: Connection timed out",
        "requests.exceptions.HTTPError: 503 Server Error: Service Unavailable for url: https://x",
        "openai.RateLimitError: Error code: 429 - {'error': {'message': 'Rate limit reached'}}",
    ] {
        assert!(
            failed(&format!("Traceback (most recent call last):\n{text}")),
            "{text}"
        );
    }
    let middle = "x".repeat(RETRYABLE_BYTES);
    for text in [
        "E       assert 503 == 200",
        "FAILED tests/test_api.py::test_limits - assert 429 == 200",
        "For example http://amazon.com returns 503 for every get request",
        "curl: (7) Failed to connect to localhost port 8000: Connection refused",
    ] {
        assert!(!failed(&format!("error: build failed\n{text}")), "{text}");
    }
    // Said between the ends of a long failure (a page or a task the output quotes).
    assert!(!failed(&format!(
        "error: build failed\n{middle}\nHTTP 503 Service Unavailable\n{middle}\nexit 1"
    )));
    assert!(failed(&format!(
        "error: build failed\n{middle}\nHTTP 503 Service Unavailable"
    )));
}

#[test]
fn nothing_found_is_one_answer_whatever_it_echoes() {
    let loaded = loopguard_rules::Policy::builtin_default();
    let c = loaded.policy.unwrap().resolve(None, None);
    let r = ResultRules::from_config(&c);
    let out = |output: &str| r.outcome(&plain_result(output));
    let nothing = [
        r#"No matches found for pattern "retry_budget" in path "src"."#,
        r#"No matches found for pattern "RetryBudget" in path "."."#,
        "No results found for query: kafka consumer lag runbook",
        "No results for 'consumer lag alert'",
        "Found 0 files matching **/*.proto",
        "0 results found.",
        "[]",
        "No files found",
    ];
    let first = out(nothing[0]);
    for text in nothing {
        let o = out(text);
        assert!(o.empty && !o.error, "{text}");
        assert_eq!(o.digest, first.digest, "{text}");
    }
    // Answers that found something, or say more than that nothing was found, are their own.
    for text in [
        "Found 3 matches for pattern \"retry\" in path \"src\":\nsrc/a.rs:1: retry",
        "No matches found for pattern \"x\".\nSearched 42 files; 3 were skipped as binary.",
        "No errors found in 12 files.",
        "Results for kafka: 2 pages",
    ] {
        let o = out(text);
        assert!(!o.empty, "{text}");
        assert_ne!(o.digest, first.digest, "{text}");
    }
}

/// An answer that found nothing is short: a long output is not read for the words that say
/// so, even where a policy's pattern would find them.
#[test]
fn a_long_output_is_not_read_for_an_empty_answer() {
    let loaded = loopguard_rules::Policy::load_text(
        std::path::Path::new("t.yaml"),
        "version: 1\nresults: { empty_patterns: ['(?i)no results'] }\n".to_owned(),
    );
    let r = ResultRules::from_config(&loaded.policy.unwrap().resolve(None, None));
    let short = "No results for the query.\n".to_owned();
    assert!(r.outcome(&plain_result(&short)).empty);
    let filler = "a line the search printed before it gave up\n".repeat(EMPTY_MAX_BYTES / 40);
    let long = format!("{filler}{short}");
    assert!(long.trim().len() > EMPTY_MAX_BYTES);
    assert!(!r.outcome(&plain_result(&long)).empty);
    let at_the_bound = &long[long.len() - EMPTY_MAX_BYTES..];
    assert!(r.outcome(&plain_result(at_the_bound)).empty);
}

/// Code that does not parse is one failure of its file, whatever the parser says of it
/// (`Outcome::syntax`), while its digest keeps what it said; other failures have no such
/// second digest.
#[test]
fn a_syntax_error_is_one_failure_of_its_file_whatever_the_parser_says() {
    let r = default_rules();
    let traceback = |file: &str, line: u32, message: &str| {
        format!(
            "Traceback (most recent call last):\n  File \"/repo/t.py\", line 1, in <module>\n    \
             import app\n  File \"{file}\", line {line}\n    x = 1\nIndentationError: {message}"
        )
    };
    let texts = [
        traceback("/repo/app.py", 362, "expected an indented block"),
        traceback(
            "/repo/app.py",
            363,
            "unindent does not match any outer indentation level",
        ),
        traceback("/repo/other.py", 362, "expected an indented block"),
        "Traceback (most recent call last):\nTypeError: x".to_owned(),
    ];
    let o: Vec<Outcome> = texts.iter().map(|t| r.outcome(&plain_result(t))).collect();
    for (t, x) in texts.iter().zip(&o) {
        assert!(x.error, "{t}");
        assert_eq!(*x, outcome_plain(&r, &plain_result(t)), "{t}");
    }
    assert_ne!(o[0].digest, o[1].digest);
    assert!(o[0].syntax.is_some());
    assert_eq!(o[0].syntax, o[1].syntax);
    assert_ne!(o[0].syntax, o[2].syntax);
    assert_eq!(o[3].syntax, None);
}

/// Editing tools say their replacement failed without the word `error`: such a result is a
/// failure, whatever the transcript's flags say.
#[test]
fn an_edit_that_found_nothing_to_replace_is_a_failure() {
    let error = |output: &str| flagless_outcome(output).error;
    for failed in [
        "The text to replace was not found",
        "String to replace not found in file.\nString: fn main() {",
        "No replacement was performed, old_str `x = 1` did not appear verbatim in /repo/a.py.",
        "The SEARCH block:\nfoo()\n...does not match anything in the file.",
        "No sufficiently similar match found at line 12 (62% similar, needs 100%)",
        "Found 0 occurrences of old_string in src/app.ts",
    ] {
        assert!(error(failed), "{failed}");
    }
    for passed in [
        "The file /repo/a.py has been edited.",
        "Replaced 1 occurrence in src/app.ts",
        "Applied edit to src/seed.ts",
        "search results: 3 files, the text to replace appears in each",
    ] {
        assert!(!error(passed), "{passed}");
    }
}

/// Test runners and builds say they failed at the end of their output, not on its first line.
#[test]
fn a_failure_summary_at_the_end_is_a_failure() {
    let error = |output: &str| flagless_outcome(output).error;
    let log = "collected 12 items\n\ntests/test_parse.py ....F.......\n".repeat(40);
    for failed in [
        format!(
            "{log}FAILED tests/test_parse.py::test_empty - AssertionError\n1 failed, 11 passed in 0.31s"
        ),
        format!("{log}===== 2 failed, 10 passed in 1.02s ====="),
        "running 4 tests\ntest a ... FAILED\n\ntest result: FAILED. 3 passed; 1 failed".to_owned(),
        "=== RUN   TestParse\n--- FAIL: TestParse (0.00s)\nFAIL\texample.com/p\t0.004s".to_owned(),
        " Tests:       1 failed, 4 passed, 5 total".to_owned(),
        "  3 passing (12ms)\n  1 failing".to_owned(),
        "> build\nnpm ERR! code ELIFECYCLE".to_owned(),
        "cc -o app main.c\nmake: *** [Makefile:4: app] Error 1".to_owned(),
    ] {
        assert!(error(&failed), "{failed}");
    }
    for passed in [
        format!("{log}12 passed in 0.31s"),
        "test result: ok. 4 passed; 0 failed".to_owned(),
        "ok  \texample.com/p\t0.004s".to_owned(),
        " Tests:       0 failed, 5 passed".to_owned(),
        "The job retried 3 failed uploads and finished.".to_owned(),
    ] {
        assert!(!error(&passed), "{passed}");
    }
}

/// A harness's `9/11 tests passed`, with no failure named, read as a success.
#[test]
fn a_summary_of_some_tests_passing_is_a_failure() {
    let out = flagless_outcome;
    assert!(out("9/11 tests passed").error);
    assert!(out("Running...\n3 of 5 checks passed.").error);
    assert!(out("19 / 22 tests passed\nsee the log").error);
    assert!(!out("11/11 tests passed").error);
    assert!(!out("0/0 tests passed").error);
    assert!(!out("Downloaded 9/11 packages").error);
    assert!(!out("9/11 tests").error);
}

/// SWE-agent wraps every rejected edit in the same header and footer: three edits rejected for
/// different errors shared their first and last lines, and so their signature.
#[test]
fn a_failure_signature_holds_the_line_naming_its_error() {
    let out = flagless_outcome;
    let rejected = |err: &str| {
        out(&format!(
            "Your proposed edit has introduced new syntax error(s). Please read this error message carefully.\n\nERRORS:\n- {err}\n\nThis is how your edit would have looked if applied\n[File: /r/p.py (120 lines total)]\n34:        return 0\nDO NOT re-run the same failed edit command. Running it again will lead to the same error."
        ))
    };
    let indent = rejected("E999 IndentationError: unexpected indent");
    let syntax = rejected("E999 SyntaxError: invalid syntax");
    assert!(indent.error && syntax.error);
    assert_ne!(indent.digest, syntax.digest);
    assert_eq!(
        indent.digest,
        rejected("E999 IndentationError: unexpected indent").digest
    );
    // A quoted token of syntax names the error; a quoted name echoes the input.
    let unmatched =
        |token: &str| rejected(&format!("E999 SyntaxError: unmatched '{token}'")).digest;
    assert_ne!(unmatched("]"), unmatched(")"));
    assert_eq!(unmatched(")"), unmatched(")"));
    // The token's closing quote opens no quote of its own.
    let near = |name: &str| {
        rejected(&format!(
            "E999 SyntaxError: unmatched ')' near '{name}' here"
        ))
        .digest
    };
    assert_eq!(near("x"), near("total_count"));
    let undefined =
        |name: &str| rejected(&format!("E999 NameError: undefined name '{name}'")).digest;
    assert_eq!(undefined("x"), undefined("pixel_array"));
    assert_eq!(undefined("_"), undefined("a_b"));
    // A failure whose first or last line names its error is known by those lines alone.
    let trace = |middle: &str| {
        out(&format!(
            "Traceback (most recent call last):\n  File \"t.py\", line 3, in <module>\n    {middle}\nValueError: bad value"
        ))
        .digest
    };
    assert_eq!(trace("raise KeyError(k)"), trace("parse(x)"));
    for (line, names) in [
        ("E999 IndentationError: unexpected indent", true),
        ("java.lang.NullPointerException", true),
        ("error[E0308]: mismatched types", true),
        ("error: could not compile `x`", true),
        ("3 errors found", false),
        ("Error: something", false),
        ("ErrorHandler registered", false),
    ] {
        assert_eq!(super::names_error(line), names, "{line}");
    }
}

/// A code agent's interpreter quotes the failing code before the exception it raised: the same
/// exception behind four ways of writing the lookup had four signatures.
#[test]
fn a_failure_ending_with_an_exception_is_known_by_it() {
    let out = |output: &str| {
        rules()[0].outcome(&ToolResult {
            is_error: true,
            ..plain_result(output)
        })
    };
    let failed = |line: &str, exception: &str| {
        out(&format!(
            "Code execution failed at line '{line}' due to: InterpreterError: Could not index {{\"a\": 1}} with \n'a': {exception}"
        ))
    };
    let string_index = "TypeError: string indices must be integers, not 'str'";
    let one = failed("x = f()['a']", string_index);
    let quoted = failed("x = f()[\"a\"]", string_index);
    let multiline = failed("s = (\n    f\"{d['a']}\"\n)", string_index);
    assert!(one.error);
    assert_eq!(one.digest, quoted.digest);
    assert_eq!(one.digest, multiline.digest);
    assert_ne!(one.digest, failed("x = f()['a']", "KeyError: 'a'").digest);
    assert_ne!(
        one.digest,
        failed(
            "x = f()['a']",
            "TypeError: 'NoneType' object is not subscriptable"
        )
        .digest
    );
    // A one-line failure is known by its exception too.
    assert_eq!(
        out("Code execution failed at line 'y = g(1)' due to: NameError: name 'g' is not defined")
            .digest,
        out(
            "Code execution failed at line 'z = g(a, b)' due to: NameError: name 'g' is not defined"
        )
        .digest
    );
    // An exception only mentioned, or an output that does not end with one, keeps its ends.
    assert_ne!(
        out("check a\nraise ValueError(msg)").digest,
        out("check b\nraise ValueError(msg)").digest
    );
    assert_ne!(
        out("ValueError: bad\nfailed at step 1").digest,
        out("ValueError: bad\nfailed at step 2").digest
    );
    for (line, at) in [
        ("TypeError: x", Some(0)),
        (
            "due to: InterpreterError: y with 'k': TypeError: z",
            Some(38),
        ),
        ("(sqlite3.OperationalError) no such table", None),
        ("E: sqlite3.OperationalError: no such table", Some(3)),
        ("java.lang.NullPointerException", Some(0)),
        ("raise ValueError(msg)", None),
        ("Error: plain", None),
        ("ErrorHandler: registered", None),
    ] {
        assert_eq!(super::exception_at(line), at, "{line}");
    }
}

/// mini-swe-agent wraps every observation in `<returncode>` and `<output>` tags: two different
/// failures shared their first and last lines, and so their signature.
#[test]
fn failures_wrapped_in_a_harness_markup_are_known_by_what_failed() {
    let out = flagless_outcome;
    let missing = out(
        "<returncode>2</returncode>\n<output>\nls: cannot access 'build': No such file or directory\n</output>",
    );
    let import = out(
        "<returncode>1</returncode>\n<output>\nTraceback (most recent call last):\n  File \"t.py\", line 1, in <module>\nImportError: cannot import name 'merge' from 'pkg'\n</output>",
    );
    let import_other = out(
        "<returncode>1</returncode>\n<output>\nTraceback (most recent call last):\n  File \"t.py\", line 1, in <module>\nImportError: cannot import name 'concat' from 'pkg'\n</output>",
    );
    assert!(missing.error && import.error && import_other.error);
    assert_ne!(missing.digest, import.digest);
    assert_eq!(import.digest, import_other.digest);
    assert!(!out("<returncode>0</returncode>\n<output>\nok\n</output>").error);
    for (line, label) in [
        ("<output>", true),
        ("</output>", true),
        ("<returncode>1</returncode>", true),
        ("<exit_code>127</exit_code>", true),
        ("<b>Error</b>: bad", false),
        ("<div>a much longer value than twelve bytes</div>", false),
        ("<a>1</b>", false),
        ("<>", false),
    ] {
        assert_eq!(super::is_label_line(line), label, "{line}");
    }
}

/// Whatever the offset a mask starts at after prose (one that splits a word in eight-byte or
/// sixteen-byte reads or not), it is masked as byte by byte.
#[test]
fn masks_after_plain_text_at_every_offset() {
    let m = all();
    let masks = [
        "deadbeefcafe",
        "abcdefab",
        "xabcdefabcd",
        "fedcba98-1234-5678-9abc-def012345678",
        "pid 42",
        "pid:  7",
        "attempt 3",
        "retry #2",
        "(3/10)",
        "#7",
        "12ms",
        "2024-05-01T12:34:56Z",
        "/tmp/abc",
        "\x1b[31m",
        "req-7f3a9c",
        "msg_01H8XK2",
        "\"took_ms\": 132",
        "é 5µs",
    ];
    for mask_text in masks {
        for pad in 0..24 {
            let text = format!(
                "{}{} then the handler calls the store_{} and goes on",
                "The handler validates the request and then "
                    .get(..pad + 20)
                    .unwrap(),
                mask_text,
                "x".repeat(pad % 9)
            );
            assert_eq!(
                mask(&m, &text),
                mask_trying_every_byte(&m, &text),
                "{text:?}"
            );
        }
    }
}

/// A token of many short words joined by `-` with too few digits for an id (`a-a-…-a-1`) was
/// read to its end from every word in it: a 120 KiB tool output took seconds. Each byte is now
/// read for ids once, and the token is masked as byte by byte.
#[test]
fn a_token_of_many_words_is_read_for_ids_once() {
    for tail in ["1", "1x", "-", "12", "12ab"] {
        let text = format!("x {}{tail} end", "a-".repeat(5000));
        super::mask::ID_BYTES_READ.with(|r| r.set(0));
        let masked = mask(&all(), &text);
        let read = super::mask::ID_BYTES_READ.with(std::cell::Cell::get);
        assert!(read <= text.len(), "{tail}: {read} bytes read for ids");
        assert_eq!(masked, mask_trying_every_byte(&all(), &text), "{tail}");
    }
}

/// An ESC followed by a multi-byte character made the masker slice inside the character.
#[test]
fn escape_before_multibyte_char() {
    assert_eq!(mask(&all(), "\x1bü ok"), "ü ok");
}

proptest::proptest! {
    /// No input makes the masker panic or split a character.
    #[test]
    fn masking_never_panics(s in "[ -~\\x1b\\néü€😀0-9a-f:/().-]{0,80}") {
        let out = mask(&all(), &s);
        proptest::prop_assert!(out.len() <= s.len() + 16 * s.len().max(1));
    }
}

#[test]
fn long_results_hash_only_the_ends() {
    let loaded = loopguard_rules::Policy::load_text(
        std::path::Path::new("t.yaml"),
        "version: 1\nresults: { max_bytes: 256 }\n".to_owned(),
    );
    let c = loaded.policy.unwrap().resolve(None, None);
    let r = ResultRules::from_config(&c);
    let mk = |mid: &str| format!("{}{}{}", "a".repeat(300), mid, "b".repeat(300));
    let (x, y) = (mk("middle one"), mk("middle two"));
    let res = |s: &str| r.outcome(&plain_result(s));
    assert_eq!(res(&x).digest, res(&y).digest);
    assert_ne!(res(&x).digest, res("short").digest);
}

// The sketch.
fn error_page(slug: &str) -> String {
    format!(
        "HTTP 500 Internal Server Error for GET /api/v2/products/{slug}/inventory\n\
         Traceback (most recent call last):\n\
         File \"/srv/app/views/inventory.py\", line 88, in get_inventory\n\
         rows = ledger.fetch_rows(product_id=product.id, warehouse=request.warehouse)\n\
         File \"/srv/app/ledger/client.py\", line 214, in fetch_rows\n\
         raise LedgerTimeout(\"ledger service did not answer within the deadline\")\n\
         ledger.errors.LedgerTimeout: ledger service did not answer within the deadline\n\
         The server could not complete your request. Please contact the administrator."
    )
}

fn bits(a: &str, b: &str) -> u32 {
    (sketch(a).unwrap() ^ sketch(b).unwrap()).count_ones()
}

#[test]
fn near_duplicates_are_close() {
    for (a, b) in [
        ("blue-widget", "red-gadget"),
        ("spring-sale-banner", "winter-coat"),
        ("a", "completely-different-product-name-here"),
    ] {
        let d = bits(&error_page(a), &error_page(b));
        assert!(d <= SKETCH_NEAR_BITS, "{a} vs {b}: {d} bits apart");
    }
}

#[test]
fn unrelated_texts_are_far() {
    let listing = "total 48\ndrwxr-xr-x  5 dev dev 4096 Mar  3 10:12 .\n\
        -rw-r--r--  1 dev dev  812 Mar  3 10:11 Cargo.toml\n\
        -rw-r--r--  1 dev dev 2210 Mar  3 10:11 README.md\n\
        drwxr-xr-x  2 dev dev 4096 Mar  3 10:12 src\n\
        drwxr-xr-x  2 dev dev 4096 Mar  3 10:12 tests\n\
        -rw-r--r--  1 dev dev  120 Mar  3 10:11 rustfmt.toml";
    let d = bits(&error_page("blue-widget"), listing);
    assert!(d > 2 * SKETCH_NEAR_BITS, "{d} bits apart");
}

#[test]
fn numbers_are_folded() {
    let a = error_page("item-1").replace("88", "12345");
    assert_eq!(sketch(&a), sketch(&error_page("item-7")));
}

/// A success is compared by digest only, so only a failure is sketched; both say whether they
/// are long enough for a sketch.
#[test]
fn only_failures_are_sketched() {
    // Without its traceback's header, the page is no failure by its words.
    let page = error_page("x").replace("Traceback (most recent call last):", "Call stack:");
    let success = rules()[0].outcome(&plain_result(&page));
    let failure = rules()[0].outcome(&ToolResult {
        is_error: true,
        ..plain_result(&page)
    });
    assert!(!success.error && success.long && success.sketch.is_none());
    assert!(failure.error && failure.long && failure.sketch.is_some());
    let short = rules()[0].outcome(&plain_result("Status: pending"));
    assert!(!short.long && short.sketch.is_none());
    for n in [0, 1, 31, 32, 33] {
        let text = "w, ".repeat(n);
        assert_eq!(
            super::sketch::has_words(&text, SKETCH_MIN_WORDS),
            n >= 32,
            "{n} words"
        );
    }
}

#[test]
fn short_texts_have_no_sketch() {
    assert_eq!(sketch("Status: pending"), None);
    assert_eq!(sketch(""), None);
    assert!(sketch(&error_page("x")).is_some());
}

#[test]
fn long_texts_cost_a_bounded_amount() {
    let long = "word ".repeat(1 << 16);
    let mut prefix = "word ".repeat(super::sketch::SKETCH_MAX_WORDS as usize);
    prefix.push_str("other tail entirely");
    assert_eq!(sketch(&long), sketch(&prefix));
}

// The one-pass masker, the sketch and the outcome against their plain forms
// (`reference.rs`).

/// Pieces of text around which the maskers' rules turn: every masker's matches and near
/// misses, in both cases, and the bytes that join or separate words.
const PIECES: &[&str] = &[
    "2024-05-01T12:34:56.123Z",
    "2024/05/01",
    "2024-05-01 12:34:56+02:00",
    "2024-05-0",
    "12:34:56",
    "9:05:07,5",
    "10:30",
    // Near misses of the fixed shapes read at once (a date's `-01-02`, a time's `hh:mm:ss`).
    "2024-05-011",
    "2024-05/01",
    "2024-05-01T12:34",
    "2024-05-01T12:34:567",
    "12:34:56:07",
    "12:345:67",
    "1:02:03",
    "123e4567-e89b-12d3-a456-426614174000",
    "ABCDEF12-e89b-12d3-a456-426614174000",
    "123e4567-e89b",
    "deadbeef",
    "DEADBEEF42",
    "deadbeefx",
    "0x1F2E3D4C",
    "0X1f2e3d4c5",
    "0x12",
    "pid 1234",
    "PID: 9",
    "pgid=3",
    "PPID#4",
    "tid  5",
    "pid",
    "pidx 3",
    "12.3s",
    "45 ms",
    "3 seconds",
    "7 minutes",
    "2 milliseconds",
    "1.5µs",
    "5µs",
    "3h",
    "3hx",
    "4m55s",
    "2.345 s",
    "2 s",
    "01:02.345",
    "1:02.3",
    "10:30.",
    "123:45.6",
    "1h2m3.5s",
    "3mins5s",
    "4m_5s",
    "1m30",
    "2hrs",
    "3d",
    "2 hours",
    "3 days",
    "5 weeks",
    "app[2211]:",
    "In [7]:",
    "Out[12]:",
    "Cell In[3], line 2",
    "Xin[4]",
    "[5]",
    "x[12]",
    "[3]:",
    "127.0.0.1:54321",
    "localhost:61234",
    ":32767",
    ":65536",
    "a:70000",
    "]:40000",
    "main.c:40213",
    "10.0.0.7:45000",
    "v1.2.3.4:45000",
    "1..2.3:45000",
    "LOCALHOST:50000",
    "[01:23<00:45,",
    "<1:02]",
    "<01:02.",
    "10:30<",
    "<10:301",
    "1.2 MB/s",
    "850KiB/s",
    "9.52it/s",
    "3 MB/sx",
    "4 mb/s",
    "seed=48213",
    "3 times",
    "3 TIMES",
    "3 timesx",
    "(3/10)",
    "(3/",
    "#7",
    "a#7",
    "/tmp/abc",
    "/var/tmp/x1",
    "/private/tmp/q",
    "\n  File \"/repo/app.py\", line 3\n",
    "File \"/repo/b.py",
    "\nIndentationError: expected an indented block\n",
    "\nSyntaxError: invalid syntax",
    "\nparser.TabError: inconsistent use of tabs",
    "\nTypeError: x",
    "x/tmp/y",
    "req-7f3a9c",
    "msg_01H8XK2",
    "x-12ab",
    "ab-12-",
    "7f3a9c",
    "1200px",
    "v0.1.0",
    "abc123def456",
    "attempt 2",
    "Attempt: 4",
    "retry #3",
    "try=1",
    "ITERATION 2",
    "round 7",
    "revision#3",
    "build 9",
    "run 9",
    "rerun 9",
    // Words of letters followed by a number (or not), and `/` before a temp path's second
    // byte or another.
    "the 5",
    "Try: 7",
    "pgid",
    "tid",
    "Attempt",
    "abcdefab",
    "fedcba98-",
    "/t",
    "/v",
    "/pq",
    "/var/",
    "took_ms: 132",
    "\"took_ms\": 132.5",
    // Volatile keys in other cases and lengths (the longest is nine bytes).
    "TIMESTAMP=5",
    "Latency: 12",
    "timestamps: 3",
    "xMillis=3",
    "run_Seconds: 2",
    "id=88",
    "\"id\":\"9\"",
    "ts='12'",
    "messageId=77",
    "request-id: 4",
    "x: 5",
    "\x1b[31m",
    "\x1b]0;t\x07",
    "\x1b]0;t\x1b\\",
    // Lines that name an error: a failure's signature, and the key of its sketch.
    "ValueError: bad 'x'",
    "KeyError",
    "due to: InterpreterError: x with 'k': TypeError: no",
    "sqlite3.OperationalError:",
    "raise ValueError(",
    "AnError",
    "Exception",
    "error: no",
    "Traceback (most recent call last):",
    "\x1b",
    "é",
    "€",
    "µ",
    "word",
    "Word",
    "a_b",
    "_1",
    "x1",
    "42",
    " ",
    "  ",
    "\n",
    "\t",
    ".",
    ",",
    "-",
    "--",
    "_",
    "/",
    "(",
    ")",
    "#",
    ":",
    "=",
    "\"",
    "'",
    "[",
    "]",
];

fn maskers(on: [bool; 9]) -> Maskers {
    let [
        ansi,
        timestamps,
        uuids,
        hex_ids,
        pids,
        durations,
        counters,
        temp_paths,
        ids,
    ] = on;
    Maskers {
        ansi,
        timestamps,
        uuids,
        hex_ids,
        pids,
        durations,
        counters,
        temp_paths,
        ids,
    }
}

proptest::proptest! {
    /// Ruling maskers out by what a word's scan learnt, and passing over the words no masker
    /// matched, masks every text as trying every masker at every byte does, whichever maskers
    /// are on.
    #[test]
    fn one_pass_masks_as_the_plain_maskers(
        parts in proptest::collection::vec(proptest::sample::select(PIECES), 0..48),
        on in proptest::array::uniform9(proptest::bool::weighted(0.8)),
    ) {
        let s: String = parts.concat();
        let m = maskers(on);
        proptest::prop_assert_eq!(mask(&m, &s), mask_trying_every_byte(&m, &s));
    }

    /// The same for masks far apart, between runs of prose and code with no cue in them (the
    /// stretches the one-pass masker jumps over), and hex letters in runs of every length.
    #[test]
    fn one_pass_masks_far_apart_as_the_plain_maskers(
        parts in proptest::collection::vec(
            (
                proptest::sample::select(PIECES),
                "[ a-zA-Z_.,;:=(){}<>\n-]{0,40}",
                "[a-fA-F]{0,12}",
            ),
            0..24,
        ),
        on in proptest::array::uniform9(proptest::bool::weighted(0.8)),
    ) {
        let s: String = parts
            .iter()
            .map(|(piece, prose, hex)| format!("{prose}{hex}{piece}"))
            .collect();
        let m = maskers(on);
        proptest::prop_assert_eq!(mask(&m, &s), mask_trying_every_byte(&m, &s));
    }

    /// The search for the next cue finds, sixteen bytes at a time, what the eight-byte one
    /// finds, from any offset (hex letters in runs across the sixteen-byte steps included).
    #[test]
    fn the_next_cue_is_found_alike_either_way(
        s in "([a-fA-F]{0,20}|[ -~]{0,6}|[g-z ]{0,24}|\x1b|é|😀){0,24}",
        from in 0usize..200,
    ) {
        let b = s.as_bytes();
        let from = from.min(b.len());
        let (wide, narrow) = super::mask::next_cue_both(b, from);
        proptest::prop_assert_eq!(wide, narrow);
    }

    /// The same for texts of arbitrary bytes from the alphabet the maskers read.
    #[test]
    fn one_pass_masks_any_text_as_the_plain_maskers(
        s in "[ -~\\x1b\\n\\té€µ😀0-9a-fA-F:/().#_=\"'xX-]{0,160}",
    ) {
        let m = all();
        proptest::prop_assert_eq!(mask(&m, &s), mask_trying_every_byte(&m, &s));
    }

    /// The word-at-a-time sketch is the byte-at-a-time one.
    #[test]
    fn sketch_is_the_plain_sketch(
        parts in proptest::collection::vec(proptest::sample::select(PIECES), 0..400),
    ) {
        let s: String = parts.concat();
        proptest::prop_assert_eq!(sketch(&s), sketch_plain(&s));
    }

    /// A result's outcome is the one computed plainly, for the default policy and for one
    /// with mask patterns, few bytes kept from each end and its own error patterns.
    #[test]
    fn outcome_is_the_plain_outcome(
        parts in proptest::collection::vec(proptest::sample::select(PIECES), 0..200),
        lead in "[ \\n\\t]{0,3}",
        is_error in proptest::bool::ANY,
        exit_code in proptest::option::of(-1i32..3),
    ) {
        let output = format!("{lead}{}", parts.concat());
        let r = ToolResult {
            session: "s",
            call_id: "c",
            output: &output,
            is_error,
            exit_code,
            time_ms: 0,
        };
        for rules in rules() {
            proptest::prop_assert_eq!(rules.outcome(&r), outcome_plain(rules, &r));
        }
    }
}

/// The default policy's result rules, and rules with mask patterns, few bytes kept from each
/// end and their own error patterns.
fn rules() -> &'static [ResultRules; 2] {
    static RULES: std::sync::OnceLock<[ResultRules; 2]> = std::sync::OnceLock::new();
    RULES.get_or_init(|| [default_rules(), patterned_rules()])
}

/// The default policy's outcome of a result with no error flag and no exit code, as chat
/// transcripts and the proxy carry them.
fn flagless_outcome(output: &str) -> Outcome {
    rules()[0].outcome(&plain_result(output))
}

fn default_rules() -> ResultRules {
    let loaded = loopguard_rules::Policy::builtin_default();
    ResultRules::from_config(&loaded.policy.unwrap().resolve(None, None))
}

fn patterned_rules() -> ResultRules {
    let loaded = loopguard_rules::Policy::load_text(
        std::path::Path::new("t.yaml"),
        "version: 1\n\
         results:\n  \
           max_bytes: 256\n  \
           patterns: [{ regex: 'word\\s+\\w', replace: '<w>' }, { regex: '[0-9]+', replace: 'N' }]\n  \
           error_patterns: ['(?i)word']\n"
            .to_owned(),
    );
    ResultRules::from_config(&loaded.policy.unwrap().resolve(None, None))
}

/// Long texts (more words than are sketched, long lines and many) give the plain sketch and
/// outcome.
#[test]
fn long_texts_as_the_plain_forms() {
    let log: String = (0..3000)
        .map(|i| {
            format!(
                "2026-11-22T10:{:02}:{:02}Z [pid {}] compiling crate_{i} v0.{}.0 ({} ms) é\n",
                (i / 60) % 60,
                i % 60,
                4000 + i % 97,
                i % 9,
                (i * 37) % 1000
            )
        })
        .collect();
    let line = "word 12 ".repeat(20_000);
    for text in [log.as_str(), line.as_str(), &log[..1000], &log[..70]] {
        assert_eq!(mask(&all(), text), mask_trying_every_byte(&all(), text));
        assert_eq!(sketch(text), sketch_plain(text));
        for rules in rules() {
            for (is_error, exit_code) in [(false, Some(0)), (false, None), (true, None)] {
                let r = ToolResult {
                    session: "s",
                    call_id: "c",
                    output: text,
                    is_error,
                    exit_code,
                    time_ms: 0,
                };
                assert_eq!(rules.outcome(&r), outcome_plain(rules, &r));
            }
        }
    }
}

#[test]
fn an_error_labelled_with_its_attempts_id_is_the_same_error() {
    let loaded = loopguard_rules::Policy::builtin_default();
    let c = loaded.policy.unwrap().resolve(None, None);
    let rules = ResultRules::from_config(&c);
    let failure = |n: u32| {
        format!(
            "Call id: call_{n}\nError:\nCode execution failed at line 'page = visit(url)' due to: ConnectionError\nNow retry."
        )
    };
    let outcome = |text: &str| {
        rules.outcome(&ToolResult {
            session: "s",
            call_id: "c",
            output: text,
            is_error: true,
            exit_code: None,
            time_ms: 0,
        })
    };
    assert_eq!(outcome(&failure(1)).digest, outcome(&failure(7)).digest);
    // The line naming what failed still tells failures apart.
    let other = failure(2).replace("ConnectionError\nNow", "TimeoutError\nLater");
    assert_ne!(outcome(&failure(1)).digest, outcome(&other).digest);
    // The same for an output that is no error.
    let fine = |n: u32| {
        format!("Call id: call_{n}\nObservation:\nExecution logs:\nPage 2 of 41\nLast output: None")
    };
    let ok = |text: &str| rules.outcome(&plain_result(text));
    assert_eq!(ok(&fine(1)).digest, ok(&fine(2)).digest);
    assert_ne!(
        ok(&fine(1)).digest,
        ok(&fine(1).replace("Page 2", "Page 3")).digest
    );
    for (line, id) in [
        ("Call id: call_3", true),
        ("request-id = 7f3a9c", true),
        ("Trace ID: 0af7651916cd43dd", true),
        ("Error: no such id: 7", false),
        ("the user id: is missing", false),
        ("id:", false),
    ] {
        assert_eq!(is_id_line(line), id, "{line}");
    }
}

/// An output is an echo when each of its non-blank lines, trimmed, is a typed line; the host's
/// label before a terminal's screen (default policy) is no line of it.
#[test]
fn an_output_of_typed_lines_only_is_an_echo() {
    use crate::fingerprint::Typed;
    let typed = Typed::of("  C-c\n\npwd\nsed -n '1,20p' app.py  \n");
    assert_eq!(typed.n, 3);
    let rules = ResultRules::from_config(&crate::tests::default_config());
    let echo = |text: &str| {
        rules
            .outcome_typed(&plain_result(text), typed.hashes())
            .echo
    };
    assert!(echo("pwd\n"));
    assert!(echo(
        "New Terminal Output:\n\nC-c\n  pwd\nsed -n '1,20p' app.py\n\n"
    ));
    assert!(echo(
        "Previous response had warnings:\nWARNINGS: - Extra text detected after JSON object\n\nNew Terminal Output:\n\npwd\n"
    ));
    // A prompt before a line, a line the command printed, or nothing at all: no echo.
    assert!(!echo("root@box:/app# pwd\n/app\nroot@box:/app#"));
    assert!(!echo("pwd\n/app\n"));
    assert!(!echo("\n \n"));
    assert!(!echo(""));
    // No typed lines: nothing is an echo.
    assert!(!rules.outcome(&plain_result("pwd\n")).echo);
    // At most 8 lines of a command are kept.
    let long = (0..12)
        .map(|i| format!("line {i}"))
        .collect::<Vec<_>>()
        .join("\n");
    assert_eq!(Typed::of(&long).n, 8);
}
