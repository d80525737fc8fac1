//! Tests of call fingerprints: canonical forms, shell normalization, and raw against parsed
//! arguments.

use super::*;
use proptest::prelude::*;
use serde_json::json;

fn rules() -> &'static (loopguard_rules::Config, FingerprintRules) {
    static RULES: std::sync::OnceLock<(loopguard_rules::Config, FingerprintRules)> =
        std::sync::OnceLock::new();
    RULES.get_or_init(|| {
        let loaded = loopguard_rules::Policy::builtin_default();
        let c = loaded.policy.unwrap().resolve(None, None);
        let f = FingerprintRules::from_config(&c);
        (c, f)
    })
}

fn keys(tool: &str, v: &Value) -> CallKeys {
    let (c, f) = rules();
    let t = f.tool_keys(c, tool);
    f.keys(&t, &Arguments::Json(v), &c.detectors.test_fix.test_commands)
}

#[test]
fn volatile_keys_and_order_are_ignored() {
    let a = keys(
        "grep",
        &json!({"pattern": "foo", "path": "src", "request_id": "r1"}),
    );
    let b = keys(
        "grep",
        &json!({"path": "src", "request_id": "r2", "pattern": "foo"}),
    );
    assert_eq!(a, b);
    let nested_a = keys("x", &json!({"q": {"a": 1, "trace_id": 5}}));
    let nested_b = keys("x", &json!({"q": {"a": 1, "trace_id": 6}}));
    assert_eq!(nested_a.exact, nested_b.exact);
}

#[test]
fn path_keys_are_known_by_their_names() {
    for k in [
        "path",
        "paths",
        "file",
        "files",
        "filename",
        "dir",
        "directory",
        "cwd",
        "folder",
        "file_path",
        "filepaths",
        "target_file",
        "work_dir",
    ] {
        assert!(is_path_key(k), "{k}");
    }
    for k in [
        "",
        "command",
        "pattern",
        "offset",
        "limit",
        "request_id",
        "dirs",
        "profile",
        "pathx",
    ] {
        assert!(!is_path_key(k), "{k}");
    }
}

#[test]
fn paths_are_normalized() {
    let a = keys("read_file", &json!({"path": "./src\\main.rs"}));
    let b = keys("read_file", &json!({"path": "src//main.rs"}));
    assert_eq!(a.exact, b.exact);
    let c = keys("read_file", &json!({"path": "src/lib.rs"}));
    assert_ne!(a.exact, c.exact);
}

#[test]
fn shell_file_reads_share_a_fuzzy_key() {
    let cat = keys("bash", &json!({"command": "cat src/main.rs"}));
    let head = keys("bash", &json!({"command": "head -n 20 ./src/main.rs"}));
    let tail = keys("bash", &json!({"command": "tail src/main.rs"}));
    let read = keys("read_file", &json!({"path": "src/main.rs"}));
    assert_ne!(cat.exact, head.exact);
    assert_eq!(cat.fuzzy, head.fuzzy);
    assert_eq!(cat.fuzzy, tail.fuzzy);
    assert_eq!(cat.fuzzy, read.fuzzy);
    assert!(cat.file_read && cat.file_op);
    let other = keys("bash", &json!({"command": "cat src/lib.rs"}));
    assert_ne!(cat.fuzzy, other.fuzzy);
    // Two operands, or a pipe, are not a single file read.
    let two = keys("bash", &json!({"command": "cat a b"}));
    assert!(!two.file_read);
    let piped = keys("bash", &json!({"command": "cat src/main.rs | grep x"}));
    assert!(!piped.file_read);
    // Paging a read tool is not a plain read.
    let paged = keys("read_file", &json!({"path": "src/main.rs", "offset": 100}));
    assert_ne!(paged.fuzzy, read.fuzzy);
}

/// Codex edits with `apply_patch` run by its shell tool, as an argument vector: the tests
/// it re-ran after each patch looked like the same failing call again.
#[test]
fn shell_commands_that_change_files_are_recognized() {
    let modifies = |cmd: &str| keys("bash", &json!({ "command": cmd })).modify;
    for cmd in [
        "apply_patch <<'EOF'\n*** Begin Patch\nEOF",
        "cd /repo && git apply fix.diff",
        "sed -i 's/a/b/' src/lib.rs",
        "cat > notes.md <<EOF\nhi\nEOF",
        "echo x >> log.txt",
        "sudo pip install requests",
        "FOO=1 npm install left-pad",
        // SWE-agent's editor commands.
        "edit 500:504\n        if payload is not None:\nend_of_edit",
        "create reproduce.py",
    ] {
        assert!(modifies(cmd), "{cmd}");
    }
    for cmd in [
        "cargo test 2>&1 | tail",
        "ls -la > /dev/null",
        "git status",
        "grep -n 'x => y' src/a.rs",
        "sed 's/a/b/' src/lib.rs",
        "pip list",
    ] {
        assert!(!modifies(cmd), "{cmd}");
    }
    let codex = |script: &str| keys("shell", &json!({"command": ["bash", "-lc", script]}));
    assert!(codex("apply_patch <<'EOF'\nx\nEOF").modify);
    assert!(codex("cargo test").test);
    assert!(!codex("cargo test").modify);
}

/// A script given as an argument vector (`["bash", "-lc", "true"]`, as Codex sends it) kept
/// the vector's fuzzy key: an agent idling with `echo 'All set.'`, `true`, `echo 'Done
/// again.'` between its repeats, or reading one file with `cat` and then `sed -n`, was never
/// seen doing the same thing. The script is now normalized as a command string is.
#[test]
fn a_script_in_an_argument_vector_is_normalized_as_a_command_string() {
    let codex = |script: &str| keys("shell", &json!({"command": ["bash", "-lc", script]}));
    let string = |cmd: &str| keys("shell", &json!({ "command": cmd }));
    for cmd in ["true", "echo 'All set.'", "echo \"Done again.\""] {
        assert_eq!(codex(cmd).fuzzy, u64::from(NOOP_FUZZY), "{cmd}");
    }
    let read = codex("cat src/parse.py");
    assert!(read.file_read);
    assert_eq!(read.fuzzy, string("cat src/parse.py").fuzzy);
    assert_eq!(read.fuzzy, codex("head -n 40 src/parse.py").fuzzy);
    assert!(codex("sleep 30").wait);
    assert_eq!(codex("cargo  test").fuzzy, string("cargo test").fuzzy);
    // The exact key stays the vector's: another shell is another call.
    assert_ne!(codex("ls").exact, string("ls").exact);
    assert_ne!(
        codex("ls").exact,
        keys("shell", &json!({"command": ["sh", "-c", "ls"]})).exact
    );
}

/// Arguments naming a text to replace and its replacement are an edit, whatever the tool.
#[test]
fn arguments_shaped_as_an_edit_are_known_by_any_tool() {
    assert!(
        keys(
            "apply_edit",
            &json!({"path": "a.ts", "search": "x", "replace": "y"})
        )
        .edit
    );
    assert!(
        keys(
            "patch_file",
            &json!({"path": "a.py", "old_str": "x", "new_str": "y"})
        )
        .edit
    );
    assert!(!keys("grep", &json!({"path": "src", "search": "x"})).edit);
    assert!(!keys("write_file", &json!({"path": "a.py", "content": "x"})).edit);
}

/// `git diff > patch.txt` counted as a write like any `>`: saving what a state query prints
/// restarted every count, while it changes nothing of the work.
#[test]
fn saving_what_a_state_query_prints_is_no_modification() {
    let modifies = |cmd: &str| keys("bash", &json!({ "command": cmd })).modify;
    for cmd in [
        "git diff > patch.txt",
        "cd /testbed && git diff astropy/modeling/core.py > patch.txt",
        "git status --short >> state.log",
    ] {
        assert!(!modifies(cmd), "{cmd}");
    }
    for cmd in [
        "git diff > patch.txt && rm old.txt",
        "cat a.txt > b.txt",
        "echo done > status.txt",
        "git diff | tee patch.txt",
    ] {
        assert!(modifies(cmd), "{cmd}");
    }
}

/// An edit whose replacement is its replaced text, byte for byte, changes nothing; one that
/// changes only whitespace (an indentation fix) does.
#[test]
fn edits_replacing_a_text_with_itself_are_known() {
    let (c, f) = rules();
    let noop = |tool: &str, v: &Value| {
        let parsed = keys(tool, v).noop_edit;
        let t = f.tool_keys(c, tool);
        let raw = f
            .keys(
                &t,
                &Arguments::Raw(&v.to_string()),
                &c.detectors.test_fix.test_commands,
            )
            .noop_edit;
        assert_eq!(parsed, raw, "{v}");
        parsed
    };
    assert!(noop(
        "str_replace_based_edit_tool",
        &json!({"command": "str_replace", "path": "a.py", "old_str": "x = 1", "new_str": "x = 1"})
    ));
    assert!(noop(
        "edit",
        &json!({"file_path": "a.py", "old_string": "a\n\"b\"", "new_string": "a\n\"b\""})
    ));
    // An escape and the character it stands for are one text.
    let t = f.tool_keys(c, "replace_in_file");
    let tests = &c.detectors.test_fix.test_commands;
    let escaped = r#"{"path": "a.py", "old": "é\"", "new": "\u00e9\u0022"}"#;
    assert!(f.keys(&t, &Arguments::Raw(escaped), tests).noop_edit);
    assert!(noop(
        "replace_in_file",
        &serde_json::from_str(escaped).unwrap()
    ));
    assert!(!noop(
        "edit",
        &json!({"file_path": "a.py", "old_string": "  x = 1", "new_string": "    x = 1"})
    ));
    assert!(!noop(
        "edit",
        &json!({"file_path": "a.py", "old_string": "x", "new_string": "y"})
    ));
    assert!(!noop(
        "edit",
        &json!({"file_path": "a.py", "old_string": "x"})
    ));
    // Two texts of one side: which pair is meant is not known.
    assert!(!noop(
        "edit",
        &json!({"old_string": "x", "old_str": "y", "new_string": "x"})
    ));
}

/// `git -C /repo commit` and `git --no-pager add` ran past the subcommand check, which read
/// only the word after `git`.
#[test]
fn literal_writes_of_shell_commands_are_read() {
    let writes = |cmd: &str| keys("bash", &json!({ "command": cmd })).writes;
    let targets = |cmd: &str| {
        let w = writes(cmd);
        (w.len, w.others_harmless)
    };
    // Echo, printf and a here-document with `cat` write literal content.
    assert_eq!(targets("echo 'x = 1' > app.py"), (1, true));
    assert_eq!(targets("printf 'a\\n' > ./a.txt"), (1, true));
    assert_eq!(targets("cat > f.py <<'EOF'\nx = 1\ny = 2\nEOF"), (1, true));
    assert_eq!(
        targets("cat <<EOF >f.py\nx = 1\nEOF\npython f.py"),
        (1, true)
    );
    // Commands that leave files alone may come with them; quoted `>` and `;` are text.
    assert_eq!(
        targets("mkdir -p d && touch d/app.py && echo \"a > b; c\" > d/app.py"),
        (1, true)
    );
    assert_eq!(
        targets("echo a > x.txt; echo b > y.txt 2>/dev/null"),
        (2, true)
    );
    assert_eq!(targets("pip install flask"), (0, true));
    // Writes not followed: appends, content from a command, a file copied, other changes.
    assert_eq!(targets("echo a >> log.txt"), (0, false));
    assert_eq!(targets("echo \"$(date)\" > stamp.txt"), (0, false));
    assert_eq!(targets("echo `date` > stamp.txt"), (0, false));
    assert_eq!(targets("echo $N > n.txt"), (0, false));
    assert_eq!(targets("echo \"r'^a+$' 5$\" > re.py"), (1, true));
    assert_eq!(targets("cat > f.py <<EOF\nhome = '$HOME'\nEOF"), (0, false));
    assert_eq!(
        targets("cat > f.py <<'EOF'\nhome = '$HOME'\nEOF"),
        (1, true)
    );
    assert_eq!(targets("cat a.txt > b.txt"), (0, false));
    assert_eq!(targets("python gen.py > out.txt"), (0, false));
    assert_eq!(targets("sed -i s/a/b/ f.py && echo x > g.py"), (1, false));
    assert_eq!(targets("echo x > g.py && git checkout f.py"), (1, false));
    assert_eq!(
        targets("cat > f.py <<EOF && python f.py\nx = 1\nEOF"),
        (0, false)
    );
    // The whole command is the content: the here-document's body included.
    let body = |b: &str| writes(&format!("cat > f.py <<'EOF'\n{b}\nEOF")).writes[0];
    assert_eq!(body("x = 1"), body("x = 1"));
    assert_ne!(body("x = 1").content, body("x = 2").content);
    assert_eq!(body("x = 1").target, body("x = 2").target);
    // The same content to another file is another write.
    let one = writes("echo x > a.py").writes[0];
    let other = writes("echo x > b.py").writes[0];
    assert_ne!(one.target, other.target);
    assert_ne!(one.content, other.content);
    // Hostile text ends the scan without a panic: open quotes, a here-document never closed.
    for cmd in [
        "echo 'a > b",
        "echo \"a > b",
        "cat > f <<EOF\nno end",
        "echo $(a > b",
        "> x",
        "<<",
    ] {
        let _ = writes(cmd);
    }
}

#[test]
fn a_subcommand_is_found_past_global_options() {
    let modifies = |cmd: &str| keys("bash", &json!({ "command": cmd })).modify;
    for cmd in [
        "git -C /repo commit -m wip",
        "git --no-pager add src/a.rs",
        "git -c user.name=bot commit -am x",
        "sudo git -C . checkout main",
    ] {
        assert!(modifies(cmd), "{cmd}");
    }
    for cmd in [
        "git -C commit status",
        "git -c commit=1 diff",
        "git log --grep commit",
    ] {
        assert!(!modifies(cmd), "{cmd}");
    }
}

/// Queries about the whole work: each command of the line is one of `shell.state_queries`
/// and names no path.
#[test]
fn state_queries_are_recognized() {
    let query = |cmd: &str| keys("bash", &json!({ "command": cmd })).query;
    for cmd in [
        "git status",
        "git status --short",
        "git -C . status --short",
        "git -C /home/dev/api status -sb",
        "git --no-pager diff --stat",
        "git diff --name-only HEAD",
        "git diff main..HEAD --stat",
        "git status --short && git diff --stat",
        "git diff --stat\ngit ls-files --modified\n",
        "git diff -- .",
    ] {
        assert!(query(cmd), "{cmd}");
    }
    for cmd in [
        // One file, or a path: a review going file by file.
        "git diff -- src/a.ts",
        "git diff src/a.ts",
        "git status --short web/",
        "git diff ../other/x.rs",
        // Anything else on the line.
        "git status --short && npm test",
        "git add f.txt && git status --short",
        "git diff | head -50",
        "git log --oneline",
        "ls",
        "",
    ] {
        assert!(!query(cmd), "{cmd}");
    }
    let codex = |script: &str| keys("shell", &json!({"command": ["bash", "-lc", script]}));
    assert!(codex("git status --short\ngit diff --stat").query);
    assert!(!codex("git commit -am x && git status").query);
    // Not a shell tool: never a query.
    assert!(!keys("read_file", &json!({"command": "git status"})).query);
}

/// The subcommand of a segment's words past its command, as plainly as it can be written: the
/// first of the next eight words not starting with `-` and not the value of `-C` or `-c`.
fn subcommand_plain<'w>(words: impl Iterator<Item = &'w str>) -> Option<&'w str> {
    let words: Vec<&str> = words.take(8).collect();
    let mut i = 0;
    while let Some(w) = words.get(i) {
        if !w.starts_with('-') {
            return Some(w);
        }
        i += if *w == "-C" || *w == "-c" { 2 } else { 1 };
    }
    None
}

/// `modifies` with every segment split by `str::split` and `split_whitespace`, as plainly as it
/// can be written: the specification of the byte-level segment and word splitting.
fn modifies_plain(f: &FingerprintRules, cmd: &str) -> bool {
    shell::writes_to_file(cmd.as_bytes())
        || cmd.split(['\n', ';', '|', '&', '(']).any(|segment| {
            let mut words = segment
                .split_whitespace()
                .skip_while(|w| *w == "sudo" || (w.contains('=') && !w.starts_with('-')));
            let Some(first) = words.next() else {
                return false;
            };
            let first = first.rsplit('/').next().unwrap_or(first);
            f.shell.modify_commands.commands.iter().any(|(w, second)| {
                **w == *first
                    && match second.as_deref() {
                        None => true,
                        Some(flag) if flag.starts_with('-') => {
                            words.clone().take(8).any(|r| r.starts_with(flag))
                        }
                        Some(sub) => subcommand_plain(words.clone()) == Some(sub),
                    }
            })
        })
}

proptest! {
    /// Splitting commands into segments and words a byte at a time finds the modify commands
    /// that `str::split` and `split_whitespace` find, Unicode whitespace and all.
    #[test]
    fn byte_level_splitting_finds_what_split_whitespace_finds(
        parts in prop::collection::vec(prop::sample::select(&[
            "sed", "-i", "sudo", "FOO=1", "-x=1", "git", "apply", "commit", "npm", "install",
            "cargo", "fmt", "test", "/usr/bin/rm", "rm", "mv", "ls", "cat", "a=b", "'x'", " ",
            "  ", "\t", "\n", "\u{b}", "\u{c}", "\r", "\u{1c}", "\u{85}", "\u{a0}", "\u{3000}",
            ";", "|", "&&", "(", ")", "é", "/", ">", ">>", "2>&1", "/dev/null", "-C", "-c",
            "--no-pager", ".",
        ][..]), 0..12),
        spaced in any::<bool>(),
    ) {
        let cmd = parts.join(if spaced { " " } else { "" });
        let f = &rules().1;
        prop_assert_eq!(f.modifies(&cmd), modifies_plain(f, &cmd), "{:?}", cmd);
    }
}

/// A cache-busting query parameter made every poll of one URL a new call.
#[test]
fn volatile_url_parameters_do_not_make_a_new_call() {
    let url = |u: &str| keys("http_request", &json!({"method": "GET", "url": u}));
    let a = url("https://x.io/api/jobs/77?_ts=1718704873&view=full");
    let b = url("https://x.io/api/jobs/77?_ts=1718704914&view=full");
    let c = url("https://x.io/api/jobs/77?view=full&request_id=9");
    assert_eq!(a.exact, b.exact);
    assert_eq!(a.exact, c.exact);
    assert_eq!(a.fuzzy, b.fuzzy);
    assert_ne!(a.exact, url("https://x.io/api/jobs/77?view=summary").exact);
    assert_ne!(a.exact, url("https://x.io/api/jobs/78?_ts=1").exact);
}

#[test]
fn wait_and_test_commands_are_recognized() {
    assert!(keys("bash", &json!({"command": "sleep 30"})).wait);
    assert!(!keys("bash", &json!({"command": "sleep 3; ls"})).wait);
    // A time limit is no wait: `timeout 60 pytest` is the test run.
    assert!(!keys("bash", &json!({"command": "timeout 60 pytest -x"})).wait);
    let poll = |cmd: &str| keys("bash", &json!({ "command": cmd })).poll;
    for cmd in [
        "sleep 3; ls",
        "sleep 30 && gh run view 42",
        "/bin/sleep 5 && curl -s localhost:8080/health",
        "until curl -sf localhost:8080; do sleep 2; done",
        "for i in 1 2 3; do kubectl get pods; sleep 5; done",
        "curl -s host/status || (sleep 5; curl -s host/status)",
    ] {
        assert!(poll(cmd), "{cmd}");
        let codex = keys("shell", &json!({"command": ["bash", "-lc", cmd]}));
        assert!(codex.poll, "{cmd} as an argument vector");
    }
    for cmd in [
        "sleep 30",
        "ls -la && cat sleepy.txt",
        "grep -r sleep src | head",
        "sleep 1; sleep 2",
        "cargo test",
    ] {
        assert!(!poll(cmd), "{cmd}");
    }
    assert!(keys("bash", &json!({"command": "cargo test -p x"})).test);
    assert!(!keys("bash", &json!({"command": "cargo build"})).test);
}

#[test]
fn remembered_test_answers_match_the_patterns() {
    let (c, f) = rules();
    let t = f.tool_keys(c, "bash");
    let tests = &c.detectors.test_fix.test_commands;
    let other = [Regex::new("^make").unwrap()];
    let cmds = (0..300).map(|i| match i % 4 {
        0 => format!("cargo test -p crate_{}", i % 37),
        1 => format!("make target_{}", i % 41),
        2 => format!("pytest tests/test_{}.py", i % 13),
        _ => format!("ls dir_{}", i % 7),
    });
    for cmd in cmds {
        for patterns in [&tests[..], &other[..], &[]] {
            let expected = patterns.iter().any(|r| r.is_match(&cmd));
            assert_eq!(t.tests.is_test(&cmd, patterns), expected, "{cmd}");
        }
    }
}

#[test]
fn a_description_beside_a_reference_is_no_part_of_the_call() {
    let (c, f) = rules();
    let tests = &c.detectors.test_fix.test_commands;
    for tool in ["browser_click", "mcp__playwright__browser_type", "click"] {
        let t = f.tool_keys(c, tool);
        let both = |text: &str| {
            let v: Value = serde_json::from_str(text).unwrap();
            let parsed = f.keys(&t, &Arguments::Json(&v), tests);
            assert_eq!(parsed, f.keys(&t, &Arguments::Raw(text), tests), "{text}");
            parsed
        };
        let a = both(r#"{"element": "Sign in button", "ref": "e31"}"#);
        let b = both(r#"{"ref": "e31", "element": "the Sign In button in the header"}"#);
        assert_eq!(a, b, "{tool}: the same target, described twice");
        let other = both(r#"{"element": "Sign in button", "ref": "e32"}"#);
        assert_ne!(a.exact, other.exact, "{tool}: another target");
        let typed = both(r#"{"element": "Email", "ref": "e5", "text": "a@example.com"}"#);
        let retyped = both(r#"{"element": "Email field", "ref": "e5", "text": "b@example.com"}"#);
        assert_ne!(typed.exact, retyped.exact, "{tool}: other text typed");
        // Without a reference the description is what names the target.
        let x = both(r#"{"element": "Sign in button"}"#);
        let y = both(r#"{"element": "Register button"}"#);
        assert_ne!(x.exact, y.exact, "{tool}: described targets");
    }
}

#[test]
fn code_that_writes_files_makes_a_call_a_write() {
    let (c, f) = rules();
    let t = f.tool_keys(c, "execute_ipython_cell");
    let both = |code: &str| {
        let v = json!({ "code": code });
        let parsed = f.keys(&t, &Arguments::Json(&v), &[]);
        assert_eq!(
            parsed,
            f.keys(&t, &Arguments::Raw(&v.to_string()), &[]),
            "{code}"
        );
        parsed.edit
    };
    assert!(both(
        "src = open('utils.py').read()\nopen('utils.py', 'w').write(src.replace('a', 'b'))"
    ));
    assert!(both(
        "from pathlib import Path\nPath('out.txt').write_text('x')"
    ));
    assert!(both("import os\nos.remove('stale.lock')"));
    assert!(!both("print(open('utils.py').read())"));
    assert!(!both("import sys\nsys.stdout.write('done')"));
    assert!(!both("1 + 1"));
}

#[test]
fn the_models_narration_of_a_call_is_no_part_of_it() {
    for (tool, key) in [
        ("list_dir", "explanation"),
        ("get_weather", "thought"),
        ("read_file", "reason"),
        ("lookup", "reasoning"),
        ("Bash", "description"),
        ("run_shell_command", "description"),
    ] {
        let a = keys(
            tool,
            &json!({"path": "dist", "command": "ls dist", key: "List the output"}),
        );
        let b = keys(
            tool,
            &json!({"path": "dist", "command": "ls dist", key: "Check it again"}),
        );
        assert_eq!(a, b, "{tool}: {key}");
    }
    // A `description` is content where the tool is no shell (an issue's body).
    let a = keys(
        "create_issue",
        &json!({"title": "Login fails", "description": "On Safari"}),
    );
    let b = keys(
        "create_issue",
        &json!({"title": "Login fails", "description": "On Firefox"}),
    );
    assert_ne!(a.exact, b.exact);
}

#[test]
fn a_shell_tool_in_a_namespace_is_a_shell_tool() {
    for tool in ["functions.shell", "default_api:run_shell_command", "shell"] {
        let cat = keys(tool, &json!({"command": "cat src/main.rs"}));
        let head = keys(tool, &json!({"command": "head -n 40 src/main.rs"}));
        assert!(cat.file_read, "{tool}");
        assert_eq!(cat.fuzzy, head.fuzzy, "{tool}: one file read");
    }
    let cat = keys(
        "functions.frobnicate",
        &json!({"command": "cat src/main.rs"}),
    );
    assert!(!cat.file_read);
}

#[test]
fn raw_arguments() {
    let (c, f) = rules();
    let t = f.tool_keys(c, "grep");
    let j = f.keys(&t, &Arguments::Raw(r#"{"pattern":"a"}"#), &[]);
    let v = json!({"pattern": "a"});
    assert_eq!(j, f.keys(&t, &Arguments::Json(&v), &[]));
    let x = f.keys(&t, &Arguments::Raw("not  json"), &[]);
    let y = f.keys(&t, &Arguments::Raw(" not json "), &[]);
    assert_eq!(x, y);
}

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i32>().prop_map(|i| json!(i)),
        "[a-z ]{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z]{1,6}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn respace(v: &Value) -> Value {
    match v {
        Value::String(s) => Value::String(format!("  {}\t", s.replace(' ', "  \n "))),
        Value::Array(a) => Value::Array(a.iter().map(respace).collect()),
        Value::Object(m) => Value::Object(m.iter().map(|(k, x)| (k.clone(), respace(x))).collect()),
        other => other.clone(),
    }
}

/// Keys with every role: primary, path, command, volatile, read-only, a description and the
/// reference it describes, and none.
const ARB_KEYS: &[&str] = &[
    "code",
    "element",
    "ref",
    "old_str",
    "new_str",
    "path",
    "file",
    "file_path",
    "filename",
    "command",
    "cmd",
    "script",
    "input",
    "pattern",
    "query",
    "url",
    "offset",
    "request_id",
    "id",
    "action",
    "mode",
    "x",
    "cwd",
    "nested_dir",
    "keystrokes",
    "chars",
    "duration",
    "yield_time_ms",
    "session_id",
];

/// Strings that exercise canonical forms, escapes, URLs, paths and shell commands.
fn arb_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z ]{0,12}",
        "[ -~]{0,24}",
        "[\\\\/\"\t\n\r\u{0}-\u{1f}a é€😀]{0,16}",
        Just("view".to_owned()),
        Just("https://h/x?_ts=1&a=2#f".to_owned()),
        Just(".//src\\\\a.rs ".to_owned()),
        Just("cat   src/a.rs".to_owned()),
        Just("cargo test -p x && echo > out".to_owned()),
    ]
}

/// Numbers of every shape `serde_json` reads differently.
fn arb_number() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<u64>().prop_map(|n| n.to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| format!("{f:e}")),
        any::<f32>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| f.to_string()),
        Just("-0".to_owned()),
        Just("0".to_owned()),
        // The most digits the scanner reads itself, and one more.
        Just("9999999999999999999".to_owned()),
        Just("10000000000000000000".to_owned()),
        Just("1.0".to_owned()),
        Just("1E2".to_owned()),
        Just("12345678901234567890123".to_owned()),
        Just("-9223372036854775809".to_owned()),
        Just("18446744073709551616".to_owned()),
        Just("1e400".to_owned()),
    ]
}

/// JSON text, written as a model might write it: any member order, duplicate keys,
/// whitespace, `\u` escapes, and numbers in every form.
fn arb_json_text() -> impl Strategy<Value = String> {
    let string = (arb_text(), any::<bool>()).prop_map(|(s, ascii)| {
        if ascii {
            // Every non-ASCII character (and `/`) as a `\u` escape.
            let mut out = String::from("\"");
            for ch in s.chars() {
                match ch {
                    '"' => out.push_str("\\\""),
                    '\\' => out.push_str("\\\\"),
                    '/' => out.push_str("\\/"),
                    c if (c as u32) < 0x20 || !c.is_ascii() => {
                        let mut units = [0u16; 2];
                        for u in c.encode_utf16(&mut units) {
                            out.push_str(&format!("\\u{u:04X}"));
                        }
                    }
                    c => out.push(c),
                }
            }
            out.push('"');
            out
        } else {
            serde_json::to_string(&s).unwrap()
        }
    });
    let leaf = prop_oneof![
        Just("null".to_owned()),
        Just("true".to_owned()),
        Just("false".to_owned()),
        arb_number(),
        string,
    ];
    let ws = prop_oneof![Just(""), Just(" "), Just("\n\t "), Just("\r\n")];
    let value = leaf.prop_recursive(3, 24, 4, move |inner| {
        prop_oneof![
            prop::collection::vec((inner.clone(), ws.clone()), 0..4).prop_map(|items| {
                let body: Vec<String> = items
                    .into_iter()
                    .map(|(v, w)| format!("{w}{v}{w}"))
                    .collect();
                format!("[{}]", body.join(","))
            }),
            prop::collection::vec((prop::sample::select(ARB_KEYS), inner, ws.clone()), 0..5)
                .prop_map(|members| {
                    let body: Vec<String> = members
                        .into_iter()
                        .map(|(k, v, w)| format!("{w}\"{k}\"{w}:{w}{v}"))
                        .collect();
                    format!("{{{}}}", body.join(","))
                }),
        ]
    });
    // Arguments are mostly objects: make the top level one most of the time.
    prop_oneof![
        3 => prop::collection::vec((prop::sample::select(ARB_KEYS), value.clone()), 0..7)
            .prop_map(|members| {
                let body: Vec<String> =
                    members.into_iter().map(|(k, v)| format!("\"{k}\": {v}")).collect();
                format!("{{{}}}", body.join(", "))
            }),
        1 => value,
    ]
}

/// The keys of raw text through the parser only, as before the scanner.
fn parsed_keys(f: &FingerprintRules, t: &ToolKeys, s: &str, tests: &[Regex]) -> CallKeys {
    f.keys_of_parsed_text(t, s, tests)
}

const ARB_TOOLS: &[&str] = &["bash", "read_file", "str_replace_editor", "grep", "x"];

#[test]
fn an_empty_text_to_send_and_a_time_to_wait_is_a_wait_for_any_tool() {
    let (c, f) = rules();
    let tests = &c.detectors.test_fix.test_commands;
    let waits = |tool: &str, s: &str| {
        let t = f.tool_keys(c, tool);
        let raw = f.keys(&t, &Arguments::Raw(s), tests);
        let v: Value = serde_json::from_str(s).unwrap();
        assert_eq!(raw, f.keys(&t, &Arguments::Json(&v), tests), "{tool} {s}");
        raw.wait
    };
    for tool in ["send_keystrokes", "write_stdin", "bash", "x"] {
        for s in [
            r#"{"keystrokes": "", "duration": 30.0}"#,
            r#"{"session_id": 3, "chars": "", "yield_time_ms": 5000}"#,
            r#"{"sessionId": "a1", "input": "", "timeout": 10, "raw": false}"#,
        ] {
            assert!(waits(tool, s), "{tool} {s}");
        }
        // A shell tool's empty command line waits whatever else comes with it (the shell's
        // own rule).
        if tool == "bash" {
            continue;
        }
        for s in [
            // Something is sent, or something else is asked for.
            r#"{"keystrokes": "make\n", "duration": 30.0}"#,
            r#"{"keystrokes": "", "duration": 30.0, "path": "/app"}"#,
            r#"{"chars": "", "yield_time_ms": 5000, "extra": ["x"]}"#,
            r#"{"query": "", "timeout": 5}"#,
            // No time to wait, or none named.
            r#"{"keystrokes": ""}"#,
            r#"{"keystrokes": "", "count": 30}"#,
        ] {
            assert!(!waits(tool, s), "{tool} {s}");
        }
    }
}

#[test]
fn raw_scan_handles_what_it_should() {
    // The common shapes are scanned, not parsed: the scanner answers for them.
    let (c, f) = rules();
    let t = f.tool_keys(c, "bash");
    let tests = &c.detectors.test_fix.test_commands;
    for s in [
        r#"{"command": "ls -la \"my dir\"\n", "timeout": 30}"#,
        r#"{"path": "src/a.rs", "offset": 10, "limit": 2.5e1, "flags": [true, null]}"#,
        r#"{"q": "caf\u00e9 \ud83d\ude00", "nested": {"a": {"b": [1, -2, 0.5]}}}"#,
    ] {
        assert!(f.keys_of_raw(&t, s, tests).is_some(), "{s}");
    }
    // What it leaves to the parser.
    for s in [
        r#"{"a": 1, "a": 2}"#,
        r#"{"\u0061": 1}"#,
        r#"{"command": ["bash", "-lc", "ls"]}"#,
        r#"{"a": "\ud800"}"#,
        "{\"a\": \"tab\there\"}",
        r#"{"a": 01}"#,
        r#"{"a": 1} x"#,
        "not json",
        "",
    ] {
        assert!(f.keys_of_raw(&t, s, tests).is_none(), "{s}");
    }
}

proptest! {
    /// Any command line, however its quotes, substitutions and here-documents are left open,
    /// is read without a panic, and a line's literal writes never outnumber its `>`.
    #[test]
    fn literal_writes_of_any_command_line(
        parts in prop::collection::vec(prop::sample::select(&[
            "echo", "printf", "cat", "x", "'", "\"", "`", "$(", ")", "(", "<<", "<<-", "<<<",
            "EOF", "'EOF'", ">", ">>", "2>", ">&", ">|", "&&", ";", "|", "\n", "\t", " ", "\\",
            "/dev/null", "f.py", "sed -i", "mkdir", "é",
        ][..]), 0..24),
    ) {
        let cmd = parts.concat();
        let w = writes::shell_writes(&cmd, |_| true);
        prop_assert!(usize::from(w.len) <= cmd.matches('>').count());
    }
}

proptest! {
    /// Raw arguments give the keys the parsed path gives, for any JSON text, for every
    /// kind of tool.
    #[test]
    fn raw_and_parsed_arguments_give_the_same_keys(s in arb_json_text()) {
        let (c, f) = rules();
        let tests = &c.detectors.test_fix.test_commands;
        for tool in ARB_TOOLS {
            let t = f.tool_keys(c, tool);
            let raw = f.keys(&t, &Arguments::Raw(&s), tests);
            prop_assert_eq!(raw, parsed_keys(f, &t, &s, tests), "tool {} text {}", tool, s);
            if let Ok(v) = serde_json::from_str::<Value>(&s) {
                prop_assert_eq!(raw, f.keys(&t, &Arguments::Json(&v), tests));
            }
        }
    }

    /// The same for text that is mostly not JSON: JSON text with bytes dropped, doubled
    /// or inserted.
    #[test]
    fn raw_and_parsed_agree_on_damaged_text(
        s in arb_json_text(),
        cuts in prop::collection::vec((any::<prop::sample::Index>(), prop::sample::select(&["", "\"", "\\", ",", "}", "]", "{", "\\u", "0", " ", "\u{1}", "e"][..])), 1..4),
    ) {
        let mut s = s;
        for (at, ins) in cuts {
            let mut i = at.index(s.len() + 1);
            while !s.is_char_boundary(i) {
                i -= 1;
            }
            if ins.is_empty() && i < s.len() {
                let mut j = i + 1;
                while !s.is_char_boundary(j) {
                    j += 1;
                }
                s.replace_range(i..j, "");
            } else {
                s.insert_str(i, ins);
            }
        }
        let (c, f) = rules();
        let tests = &c.detectors.test_fix.test_commands;
        for tool in ARB_TOOLS {
            let t = f.tool_keys(c, tool);
            prop_assert_eq!(
                f.keys(&t, &Arguments::Raw(&s), tests),
                parsed_keys(f, &t, &s, tests),
                "tool {} text {}", tool, s
            );
        }
    }

    /// Raw arguments of any shape fingerprint without panicking, for any tool kind.
    #[test]
    fn raw_arguments_never_panic(s in "[ -~\\\\é€]{0,60}") {
        let (c, f) = rules();
        for tool in ["bash", "read_file", "x"] {
            let t = f.tool_keys(c, tool);
            let _ = f.keys(&t, &Arguments::Raw(&s), &c.detectors.test_fix.test_commands);
            let wrapped = format!("{{\"command\": {:?}, \"path\": {:?}}}", s, s);
            let _ = f.keys(&t, &Arguments::Raw(&wrapped), &c.detectors.test_fix.test_commands);
        }
    }

    /// The word-at-a-time check agrees with the byte-at-a-time definitions.
    #[test]
    fn plain_strings_are_exactly_the_canonical_printable_ones(
        s in prop_oneof!["[ -~\\t\\né/\\\\.]{0,40}", "[ a./\\\\\\t\\x7fé]{0,24}"],
        path in any::<bool>(),
    ) {
        let expected = s.bytes().all(|b| (0x20..=0x7f).contains(&b))
            && collapsed(&s)
            && (!path || clean_path(&s));
        prop_assert_eq!(plain(s.as_bytes(), path), expected, "{:?}", s);
    }

    #[test]
    fn key_order_never_matters(entries in prop::collection::vec(("[a-z]{1,6}", arb_json()), 0..6)) {
        let (c, f) = rules();
        let t = f.tool_keys(c, "tool");
        let mut dedup = std::collections::BTreeMap::new();
        for (k, v) in entries { dedup.insert(k, v); }
        // Build the object in two insertion orders.
        let fwd: Map<String, Value> = dedup.clone().into_iter().collect();
        let rev: Map<String, Value> = dedup.into_iter().rev().collect();
        let (a, b) = (Value::Object(fwd), Value::Object(rev));
        prop_assert_eq!(f.keys(&t, &Arguments::Json(&a), &[]), f.keys(&t, &Arguments::Json(&b), &[]));
    }

    #[test]
    fn whitespace_never_matters(v in arb_json()) {
        let (c, f) = rules();
        let t = f.tool_keys(c, "tool");
        let w = respace(&v);
        prop_assert_eq!(f.keys(&t, &Arguments::Json(&v), &[]), f.keys(&t, &Arguments::Json(&w), &[]));
    }

    #[test]
    fn volatile_keys_never_matter(v in arb_json(), id in any::<u64>(), ts in "[0-9:]{1,10}") {
        let (c, f) = rules();
        let t = f.tool_keys(c, "tool");
        let base = json!({"query": v.clone()});
        let noisy = json!({"query": v, "request_id": id, "timestamp": ts});
        prop_assert_eq!(f.keys(&t, &Arguments::Json(&base), &[]), f.keys(&t, &Arguments::Json(&noisy), &[]));
    }

    #[test]
    fn primary_changes_always_matter(a in "[a-z0-9/]{1,20}", b in "[a-z0-9/]{1,20}", other in arb_json()) {
        prop_assume!(a != b);
        let (c, f) = rules();
        let t = f.tool_keys(c, "search");
        let x = json!({"query": a, "extra": other.clone()});
        let y = json!({"query": b, "extra": other});
        let kx = f.keys(&t, &Arguments::Json(&x), &[]);
        let ky = f.keys(&t, &Arguments::Json(&y), &[]);
        prop_assert_ne!(kx.exact, ky.exact);
        prop_assert_ne!(kx.fuzzy, ky.fuzzy);
    }
}

/// Command lines that change nothing and show nothing of the work: what they print is their
/// own text or where and who the shell is.
#[test]
fn lines_that_only_show_the_shell_do_nothing() {
    use super::shell::noop;
    for cmd in [
        "echo alive",
        "pwd",
        "pwd -P",
        "whoami",
        "date",
        "date +%s",
        "date -u",
        "clear",
        "C-c",
        "C-c\npwd",
        "Enter",
        "restart=true",
        "A=1 B=two",
        "true && echo ok",
    ] {
        assert!(noop(cmd), "{cmd}");
    }
    for cmd in [
        "date -s '2020-01-01'",
        "hostname build-box",
        "FOO=1 make",
        "pwd; rm -rf build",
        "echo $HOME",
        "C-c\npython3 app.py",
        "ls",
        "C-cc",
        "1x=2",
        "x=$(id)",
    ] {
        assert!(!noop(cmd), "{cmd}");
    }
}

/// Spaces around the operators joining commands are no part of a command line; inside quotes
/// they are.
#[test]
fn spacing_around_shell_operators_is_ignored() {
    let fuzzy = |cmd: &str| keys("bash", &json!({ "command": cmd })).fuzzy;
    let same = [
        "cd /srv/app && git status -sb",
        "cd /srv/app&& git status -sb",
        "cd /srv/app&&git status -sb",
        "  cd /srv/app  &&   git status -sb ",
    ];
    for cmd in same {
        assert_eq!(fuzzy(cmd), fuzzy(same[0]), "{cmd}");
    }
    assert_eq!(fuzzy("ls | wc -l; pwd"), fuzzy("ls|wc -l ;pwd"));
    assert_ne!(fuzzy("grep 'a | b' log.txt"), fuzzy("grep 'a|b' log.txt"));
    assert_ne!(
        fuzzy("cd /srv/app && git status"),
        fuzzy("cd /srv/ap && pgit status")
    );
    assert_ne!(fuzzy("a && b"), fuzzy("a & b"));
}
