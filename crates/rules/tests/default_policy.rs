#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test code: failing loudly is the point

use loopguard_rules::{Action, Policy};

#[test]
fn builtin_default_is_valid_and_has_no_warnings() {
    let loaded = Policy::builtin_default();
    for d in &loaded.diagnostics {
        eprintln!("{}", loaded.sources.render(d));
    }
    assert!(loaded.diagnostics.is_empty());
    let policy = loaded.policy.expect("default policy builds");
    let cfg = policy.base();
    assert_eq!(cfg.window_size, 30);
    assert_eq!(
        cfg.place_tool("read_file")
            .category
            .map(|c| c.name.as_str()),
        Some("exploration")
    );
    assert_eq!(
        cfg.place_tool("mcp__github__read_issue")
            .category
            .map(|c| c.name.as_str()),
        Some("exploration")
    );
    // Another framework's spelling of a listed name lands with it (tool names compare
    // without case in the default policy, as `describe` looks them up lowercased).
    for (tool, category) in [
        ("readfile", "exploration"),
        ("read-file", "exploration"),
        ("settodolist", "bookkeeping"),
        ("strreplacefile", "modification"),
        ("runshellcommand", "shell"),
        // A name in a namespace is placed by its own part.
        ("functions.shell", "shell"),
        ("default_api:read_file", "exploration"),
        ("tools/grep", "exploration"),
        ("functions.apply_patch", "modification"),
        ("default_api.ReadFile", "exploration"),
        // Answers that vary by themselves: searches, sub-agents.
        ("WebSearch", "research"),
        ("mcp__exa__web_search_exa", "research"),
        ("Task", "delegation"),
        ("delegate_work_to_coworker", "delegation"),
        // Names written as words (CrewAI's), by the snake-case name they make.
        ("Delegate work to coworker", "delegation"),
        ("Ask question to coworker", "delegation"),
        ("Search the internet with Serper", "research"),
        ("Web Search Tool", "research"),
        ("Read a file's content", "exploration"),
        ("List files in directory", "exploration"),
        ("Read website content", "exploration"),
        ("File Writer Tool", "modification"),
        ("tavily_search_results_json", "research"),
        // Names that start with a write.
        ("createIssue", "modification"),
        ("mcp__github__create_issue", "modification"),
        ("mcp__jupyter__update_cell", "modification"),
        ("delete_row", "modification"),
        // The bookkeeping tools keep their own category.
        ("update_plan", "bookkeeping"),
        ("write_todos", "bookkeeping"),
    ] {
        assert_eq!(
            cfg.place_tool(tool).category.map(|c| c.name.as_str()),
            Some(category),
            "{tool}"
        );
    }
    // A namespace named after a listed tool does not place the tool in it.
    assert_eq!(
        cfg.place_tool("shell.frobnicate")
            .category
            .map(|c| c.name.as_str()),
        Some("default")
    );
    // Words that make no listed name stay in `default`.
    assert_eq!(
        cfg.place_tool("Frobnicate the widget")
            .category
            .map(|c| c.name.as_str()),
        Some("default")
    );
    assert_eq!(
        cfg.place_tool("frobnicate")
            .category
            .map(|c| c.name.as_str()),
        Some("default")
    );
    assert_eq!(
        cfg.place_tool("read_file")
            .category
            .map(|c| c.detectors.exact_repeat.threshold),
        Some(4)
    );
    assert_eq!(cfg.detectors.exact_repeat.threshold, 3);
    let ladder = &cfg.ladders["default"];
    assert_eq!(ladder.step(1, 0).map(|s| s.action), Some(Action::Warn));
    assert_eq!(ladder.step(1, 4).map(|s| s.action), Some(Action::Block));
    assert_eq!(ladder.step(2, 0).map(|s| s.action), Some(Action::Block));
    assert_eq!(ladder.step(9, 0).map(|s| s.action), Some(Action::Terminate));
    assert!(!cfg.detectors.test_fix.test_commands.is_empty());
    assert!(cfg.detectors.test_fix.test_commands[0].is_match("cargo test --workspace"));
    assert!(!cfg.user.repeat_requests.is_empty());
}
