//! Checks that need the whole, merged policy: rules that types alone cannot express.

use std::collections::HashMap;

use crate::check::{GLOB_TOTAL_LIMIT, NameGlob, compile_glob, has_glob_syntax};
use crate::diagnostic::{Diagnostic, did_you_mean};
use crate::node::{Node, Value};
use crate::schema::{Detector, FORMAT_VERSION};

/// Largest window that is not suspicious.
const LARGE_WINDOW: i64 = 200;

/// Rejects a format version this build does not know.
pub(crate) fn check_version(file: &Node, out: &mut Vec<Diagnostic>) {
    if let Some(v) = file.get("version")
        && let Value::Int(n) = v.value
        && n != FORMAT_VERSION
    {
        out.push(
            Diagnostic::error(
                "unsupported-version",
                v.span,
                format!("unsupported policy format version `{n}`"),
            )
            .with_label("not a version this build reads")
            .with_help(format!(
                "this build of loopguard reads `version: {FORMAT_VERSION}`"
            )),
        );
    }
}

/// Runs every semantic check on the merged tree and on it with each override applied.
pub fn check(root: &Node, out: &mut Vec<Diagnostic>) {
    check_tree(root, out);
    let overrides = root
        .get("overrides")
        .and_then(Node::as_seq)
        .unwrap_or_default();
    for o in overrides {
        let m = o.get("match");
        if m.is_none_or(|m| m.as_map().is_none_or(<[_]>::is_empty)) {
            out.push(
                Diagnostic::warning(
                    "override-matches-all",
                    o.span,
                    "override has no `match`: it applies to every request",
                )
                .with_label("this override")
                .with_help(
                    "add `match: {backend: …, model: …}`, or move these settings to the top level",
                ),
            );
        }
        let mut merged = root.clone();
        let mut body = o.clone();
        if let Value::Map(entries) = &mut body.value {
            entries.retain(|(k, _)| k.as_str() != Some("match"));
        }
        merged.merge(&body);
        check_tree(&merged, out);
    }
    check_unused_ladders(root, out);
}

fn check_tree(root: &Node, out: &mut Vec<Diagnostic>) {
    check_categories(root, out);
    check_tool_categories(root, out);
    check_ladders(root, out);
    check_ladder_refs(root, out);
    let window = root.path("window.size");
    if let Some(detectors) = root.get("detectors") {
        check_detectors(detectors, window, out);
    }
    for (_, cat) in root
        .get("categories")
        .and_then(Node::as_map)
        .unwrap_or_default()
    {
        if let Some(detectors) = cat.get("detectors") {
            let mut merged = root.get("detectors").cloned().unwrap_or(Node {
                value: Value::Null,
                span: cat.span,
            });
            merged.merge(detectors);
            // Only report on values this category sets itself.
            let mut local = Vec::new();
            check_detectors(&merged, window, &mut local);
            out.extend(
                local
                    .into_iter()
                    .filter(|d| d.span.is_some_and(|s| within(detectors, s))),
            );
        }
    }
    if let (Some(size), true) = (window, int(window).unwrap_or(0) > LARGE_WINDOW) {
        out.push(
            Diagnostic::warning("large-window", size.span, format!("window of {} calls is large", int(window).unwrap_or(0)))
                .with_label("kept for every session")
                .with_help(format!("windows above {LARGE_WINDOW} cost memory per session and time per event; loops show within a few dozen calls")),
        );
    }
    if let Some(ttl) = root.path("time.ttl_seconds")
        && let Value::Int(n) = ttl.value
        && n > 0
        && n < 10
    {
        out.push(
            Diagnostic::warning(
                "short-ttl",
                ttl.span,
                format!("a TTL of {n}s forgets calls almost at once"),
            )
            .with_label("very short")
            .with_help(
                "fast loops repeat every few seconds; use 0 (no expiry) or tens of seconds or more",
            ),
        );
    }
}

fn within(outer: &Node, span: crate::node::Span) -> bool {
    fn walk(n: &Node, span: crate::node::Span) -> bool {
        if n.span == span {
            return true;
        }
        match &n.value {
            Value::Map(entries) => entries.iter().any(|(k, v)| k.span == span || walk(v, span)),
            Value::Seq(items) => items.iter().any(|i| walk(i, span)),
            _ => false,
        }
    }
    walk(outer, span)
}

/// A value that comes from the declared defaults rather than from a file.
fn is_default(node: &Node) -> bool {
    node.span.source.0 == u32::MAX
}

fn int(node: Option<&Node>) -> Option<i64> {
    match node?.value {
        Value::Int(i) => Some(i),
        _ => None,
    }
}

fn check_detectors(detectors: &Node, window: Option<&Node>, out: &mut Vec<Diagnostic>) {
    let size = int(window);
    for detector in Detector::POLICY {
        let name = detector.name();
        let Some(det) = detectors.get(name) else {
            continue;
        };
        if let Some(t) = det.get("threshold")
            && int(Some(t)) == Some(1)
        {
            out.push(
                Diagnostic::warning(
                    "threshold-one",
                    t.span,
                    format!("`{name}.threshold: 1` flags the very first occurrence"),
                )
                .with_label("flags every call")
                .with_help("a threshold of 1 is not loop detection; use 2 or more"),
            );
        }
        if let (Some(size), true) = (size, detector.windowed())
            && let Some(t) = det.get("threshold")
            && let Some(n) = int(Some(t))
            && n > size
        {
            // A threshold left at its default has no place in the file: point at the window.
            let (span, message) = match window {
                Some(w) if is_default(t) => (
                    w.span,
                    format!(
                        "window of {size} calls is smaller than the default `{name}.threshold` ({n})"
                    ),
                ),
                _ => (
                    t.span,
                    format!("`{name}.threshold` is {n} but the window holds only {size} calls"),
                ),
            };
            out.push(
                Diagnostic::error("window-too-small", span, message)
                    .with_label("can never be reached")
                    .with_help(format!(
                        "raise `window.size` to at least {n}, or lower `{name}.threshold`"
                    )),
            );
        }
    }
    if let Some(cycle) = detectors.get(Detector::Cycle.name()) {
        let (min, max, reps) = (
            int(cycle.get("min_period")),
            int(cycle.get("max_period")),
            int(cycle.get("repetitions")),
        );
        let written = |a: &str, b: &str| {
            let (a, b) = (cycle.get(a), cycle.get(b));
            a.filter(|n| !is_default(n))
                .or(b.filter(|n| !is_default(n)))
                .or(a)
                .or(b)
        };
        if let (Some(min), Some(max)) = (min, max)
            && min > max
            && let Some(node) = written("min_period", "max_period")
        {
            out.push(
                Diagnostic::error(
                    "inverted-range",
                    node.span,
                    format!("`cycle.min_period` ({min}) is above `cycle.max_period` ({max})"),
                )
                .with_label("larger than max_period")
                .with_help("swap the two values"),
            );
        }
        if let (Some(size), Some(max), Some(reps)) = (size, max, reps)
            && max * reps > size
            && let Some(node) = written("max_period", "repetitions")
        {
            let span = match window {
                Some(w) if is_default(node) => w.span,
                _ => node.span,
            };
            out.push(
                Diagnostic::error(
                    "window-too-small",
                    span,
                    format!("a cycle of {max} calls repeated {reps} times needs {} calls but the window holds only {size}", max * reps),
                )
                .with_label("can never be reached")
                .with_help(format!("raise `window.size` to at least {}, or lower `max_period` or `repetitions`", max * reps)),
            );
        }
    }
    if let Some(ch) = detectors.get(Detector::Chanting.name())
        && let (Some(min), Some(max)) =
            (int(ch.get("min_unit_chars")), int(ch.get("max_unit_chars")))
        && min > max
        && let Some(node) = ch.get("min_unit_chars")
    {
        out.push(
            Diagnostic::error(
                "inverted-range",
                node.span,
                format!(
                    "`chanting.min_unit_chars` ({min}) is above `chanting.max_unit_chars` ({max})"
                ),
            )
            .with_label("larger than max_unit_chars")
            .with_help("swap the two values"),
        );
    }
}

fn check_categories(root: &Node, out: &mut Vec<Diagnostic>) {
    let cats = root
        .get("categories")
        .and_then(Node::as_map)
        .unwrap_or_default();
    // Every pattern in order: (category name, pattern node, its text).
    let mut patterns: Vec<(&str, &Node, &str)> = Vec::new();
    for (name_node, cat) in cats {
        let Some(name) = name_node.as_str() else {
            continue;
        };
        let tools = cat.get("tools").and_then(Node::as_seq);
        if name != "default" && tools.is_none_or(<[_]>::is_empty) {
            out.push(
                Diagnostic::warning(
                    "empty-category",
                    name_node.span,
                    format!("category `{name}` lists no tools"),
                )
                .with_label("applies to nothing")
                .with_help("add `tools: [...]`, or name it `default` to hold every unlisted tool"),
            );
        }
        for pattern in tools.unwrap_or_default() {
            if let Some(p) = pattern.as_str() {
                patterns.push((name, pattern, p));
            }
        }
    }
    // A pattern overlaps an earlier one of another category when both are the same text, or
    // one is a plain name the other (a glob) matches. Plain names are compared through a map,
    // and each distinct plain name is matched once against a set of every glob: a long list
    // costs a lookup and one search per name, never a compile or a match per pair.
    let globs: Vec<(usize, NameGlob)> = patterns
        .iter()
        .enumerate()
        .filter(|(_, (_, _, p))| has_glob_syntax(p))
        // Past the limit the policy is refused already: the rest are not compiled.
        .take(GLOB_TOTAL_LIMIT)
        .filter_map(|(i, (_, _, p))| Some((i, compile_glob(p).ok()?)))
        .collect();
    let set = glob_set(&globs);
    // For each pattern, the earliest pattern before it that overlaps it.
    let mut overlaps: Vec<Option<usize>> = vec![None; patterns.len()];
    let mut earlier = |later: usize, j: usize| {
        let slot = &mut overlaps[later];
        *slot = Some(slot.map_or(j, |s| s.min(j)));
    };
    // The first pattern of each text in each category, by text.
    let mut first: HashMap<&str, Vec<(usize, &str)>> = HashMap::new();
    for (i, &(name, _, p)) in patterns.iter().enumerate() {
        let seen = first.entry(p).or_default();
        if let Some(&(j, _)) = seen.iter().find(|(_, c)| *c != name) {
            earlier(i, j);
        }
        if seen.iter().any(|(_, c)| *c == name) {
            continue; // the same text again in one category: matched like the first
        }
        seen.push((i, name));
        if has_glob_syntax(p) {
            continue;
        }
        let hits: Vec<usize> = match &set {
            Some(set) => set.matches(p).into_iter().map(|k| globs[k].0).collect(),
            None => globs
                .iter()
                .filter(|(_, g)| g.is_match(p))
                .map(|(k, _)| *k)
                .collect(),
        };
        for k in hits {
            if patterns[k].0 != name {
                if k < i {
                    earlier(i, k);
                } else {
                    earlier(k, i);
                }
            }
        }
    }
    // A plain name repeated in its category overlaps what its first occurrence overlaps.
    for (i, &(name, _, p)) in patterns.iter().enumerate() {
        if overlaps[i].is_none()
            && !has_glob_syntax(p)
            && let Some(&(f, _)) = first
                .get(p)
                .and_then(|s| s.iter().find(|(_, c)| *c == name))
            && f != i
            && let Some(j) = overlaps[f].filter(|&j| j < i && has_glob_syntax(patterns[j].2))
        {
            overlaps[i] = Some(j);
        }
    }
    for (i, &(name, pattern, p)) in patterns.iter().enumerate() {
        let Some(j) = overlaps[i] else { continue };
        let (other_name, _, q) = patterns[j];
        let what = if p == q {
            format!("tool `{p}`")
        } else {
            format!("tool `{p}` (matching `{q}`)")
        };
        out.push(
            Diagnostic::error(
                "tool-in-two-categories",
                pattern.span,
                format!("{what} is in categories `{other_name}` and `{name}`"),
            )
            .with_label(format!("already in `{other_name}`"))
            .with_help("a tool belongs to one category: remove it from one, or place it with `tools.<name>.category`"),
        );
    }
}

/// One set of the compiled globs, searched once per name (`None` if `globset` cannot build
/// it: then each glob is matched on its own).
fn glob_set(globs: &[(usize, NameGlob)]) -> Option<globset::GlobSet> {
    let mut builder = globset::GlobSetBuilder::new();
    for (_, g) in globs {
        match g {
            NameGlob::Glob(m) => builder.add(m.glob().clone()),
            NameGlob::Literal(_) => return None,
        };
    }
    builder.build().ok()
}

/// `tools.<name>.category` names a category of the policy.
fn check_tool_categories(root: &Node, out: &mut Vec<Diagnostic>) {
    let names: Vec<String> = root
        .get("categories")
        .and_then(Node::as_map)
        .unwrap_or_default()
        .iter()
        .map(|(k, _)| k.scalar_text())
        .collect();
    for (_, tool) in root.get("tools").and_then(Node::as_map).unwrap_or_default() {
        let Some(c) = tool.get("category") else {
            continue;
        };
        let Some(name) = c.as_str() else { continue };
        if names.iter().any(|n| n == name) {
            continue;
        }
        let d = Diagnostic::error(
            "unknown-category",
            c.span,
            format!("unknown category `{name}`"),
        )
        .with_label("no category of this name");
        out.push(match did_you_mean(name, names.iter().map(String::as_str)) {
            Some(near) => d.with_help(format!("did you mean `{near}`?")),
            None => d.with_help(format!(
                "categories defined: {}",
                names
                    .iter()
                    .map(|n| format!("`{n}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        });
    }
}

fn check_ladders(root: &Node, out: &mut Vec<Diagnostic>) {
    for (name_node, ladder) in root
        .get("ladders")
        .and_then(Node::as_map)
        .unwrap_or_default()
    {
        let name = name_node.scalar_text();
        let Some(steps) = ladder.as_seq() else {
            continue;
        };
        if steps.is_empty() {
            out.push(
                Diagnostic::error("empty-ladder", ladder.span, format!("ladder `{name}` has no steps"))
                    .with_label("no steps")
                    .with_help("add steps such as `- {repeat: 1, action: warn}` and end with `block` or `terminate`"),
            );
            continue;
        }
        let key = |s: &Node| {
            (
                int(s.get("repeat")).unwrap_or(0),
                int(s.get("flags")).unwrap_or(0),
            )
        };
        let action = |s: &Node| {
            s.get("action")
                .and_then(Node::as_str)
                .unwrap_or("")
                .to_owned()
        };
        // The last step that applies is taken, so a step is dead when a later step applies
        // whenever it does (a later step with lower or equal `repeat` and `flags`).
        for (i, step) in steps.iter().enumerate() {
            let a = key(step);
            if let Some(later) = steps[i + 1..].iter().find(|l| {
                let b = key(l);
                b.0 <= a.0 && b.1 <= a.1
            }) {
                let b = key(later);
                if a == b {
                    out.push(
                        Diagnostic::error(
                            "unreachable-step",
                            step.span,
                            format!("a step of ladder `{name}` can never apply"),
                        )
                        .with_label("a later step has the same conditions and is taken instead")
                        .with_help(
                            "give each step a higher `repeat` or `flags` than the one before",
                        ),
                    );
                } else {
                    out.push(
                        Diagnostic::error("ladder-not-ascending", later.span, format!("steps of ladder `{name}` are not in ascending order"))
                            .with_label(format!("repeat {} / flags {} comes after repeat {} / flags {}", b.0, b.1, a.0, a.1))
                            .with_help("order steps by `repeat` (and `flags`), lowest first; the last step that applies is taken"),
                    );
                }
            }
        }
        if let Some(last) = steps.last() {
            let a = action(last);
            // An unknown action is reported by the type check already.
            if crate::schema::ACTIONS.contains(&a.as_str()) && a != "block" && a != "terminate" {
                out.push(
                    Diagnostic::error(
                        "ladder-never-escalates",
                        last.span,
                        format!(
                            "ladder `{name}` ends with `{a}`: a loop that persists is never stopped"
                        ),
                    )
                    .with_label("last step")
                    .with_help("end the ladder with a `block` or `terminate` step"),
                );
            }
        }
    }
}

fn ladder_names(root: &Node) -> Vec<String> {
    root.get("ladders")
        .and_then(Node::as_map)
        .unwrap_or_default()
        .iter()
        .map(|(k, _)| k.scalar_text())
        .collect()
}

fn check_ladder_refs(root: &Node, out: &mut Vec<Diagnostic>) {
    let names = ladder_names(root);
    let mut refs: Vec<&Node> = Vec::new();
    refs.extend(root.path("escalation.ladder"));
    refs.extend(root.path("group.ladder"));
    fn detector_refs<'a>(d: Option<&'a Node>, refs: &mut Vec<&'a Node>) {
        for (_, det) in d.and_then(Node::as_map).unwrap_or_default() {
            refs.extend(det.get("ladder"));
        }
    }
    let detectors = root.get("detectors");
    detector_refs(detectors, &mut refs);
    for (_, cat) in root
        .get("categories")
        .and_then(Node::as_map)
        .unwrap_or_default()
    {
        refs.extend(cat.get("ladder"));
        detector_refs(cat.get("detectors"), &mut refs);
    }
    for p in root
        .get("plugins")
        .and_then(Node::as_seq)
        .unwrap_or_default()
    {
        refs.extend(p.get("ladder"));
    }
    for r in refs {
        let Some(name) = r.as_str() else { continue };
        if !names.iter().any(|n| n == name) {
            let mut d =
                Diagnostic::error("unknown-ladder", r.span, format!("unknown ladder `{name}`"))
                    .with_label("no ladder of this name");
            d = match did_you_mean(name, names.iter().map(String::as_str)) {
                Some(near) => d.with_help(format!("did you mean `{near}`?")),
                None => d.with_help(format!(
                    "ladders defined: {}",
                    names
                        .iter()
                        .map(|n| format!("`{n}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )),
            };
            out.push(d);
        }
    }
}

fn check_unused_ladders(root: &Node, out: &mut Vec<Diagnostic>) {
    let text = root.to_json().to_string();
    for (name_node, _) in root
        .get("ladders")
        .and_then(Node::as_map)
        .unwrap_or_default()
    {
        let Some(name) = name_node.as_str() else {
            continue;
        };
        // A ladder is used when any `ladder:` value names it; the JSON text holds every value.
        if is_default(name_node) {
            continue; // declared default, not written by the operator
        }
        let quoted = format!("\"ladder\":\"{name}\"");
        if !text.contains(&quoted) && !["break", "chance_then_break", "default"].contains(&name) {
            out.push(
                Diagnostic::warning("unused-ladder", name_node.span, format!("ladder `{name}` is never used"))
                    .with_label("defined here")
                    .with_help("name it in `escalation.ladder`, a category's `ladder` or a detector's `ladder`, or remove it"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn overlaps(yaml: &str) -> Vec<String> {
        let root = crate::policy::parse_default(yaml);
        let mut out = Vec::new();
        check_categories(&root, &mut out);
        out.into_iter()
            .filter(|d| d.code == "tool-in-two-categories")
            .map(|d| d.message)
            .collect()
    }

    #[test]
    fn a_tool_in_two_categories_is_reported_once_at_the_later_pattern() {
        let found = overlaps(
            "categories:\n  a: { tools: [x, \"mcp__*\", y] }\n  b: { tools: [y, mcp__fs, x, x] }\n  c: { tools: [\"m*\"] }\n",
        );
        assert_eq!(
            found,
            [
                "tool `y` is in categories `a` and `b`",
                "tool `mcp__fs` (matching `mcp__*`) is in categories `a` and `b`",
                "tool `x` is in categories `a` and `b`",
                "tool `x` is in categories `a` and `b`",
                "tool `m*` (matching `mcp__fs`) is in categories `b` and `c`",
            ]
        );
        // One category may list a name twice, and a glob beside the names it matches.
        assert!(overlaps("categories:\n  a: { tools: [x, x, \"x*\", xy] }\n").is_empty());
        // Two globs are not compared with each other.
        assert!(
            overlaps("categories:\n  a: { tools: [\"a*\"] }\n  b: { tools: [\"ab*\"] }\n")
                .is_empty()
        );
    }

    #[test]
    fn a_name_repeated_after_a_glob_of_another_category_is_reported() {
        let found =
            overlaps("categories:\n  a: { tools: [\"w*\"] }\n  b: { tools: [write, write] }\n");
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found.iter().all(|m| m.contains("(matching `w*`)")));
    }
}
