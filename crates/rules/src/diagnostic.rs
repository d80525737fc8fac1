//! Errors and warnings about a policy, each tied to a place in a source file.

use std::fmt;
use std::path::{Path, PathBuf};

use miette::{
    GraphicalReportHandler, GraphicalTheme, LabeledSpan, MietteError, MietteSpanContents,
    SourceCode, SourceSpan, SpanContents,
};

use crate::node::{SourceId, Span};

/// How serious a diagnostic is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// The policy loads; the finding is worth fixing.
    Warning,
    /// The policy does not load.
    Error,
}

impl Severity {
    /// The lowercase word shown in reports and JSON: `warning` or `error`.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Warning => "warning",
            Severity::Error => "error",
        }
    }
}

/// One finding about a policy: what is wrong, where, and how to fix it.
#[derive(Clone, Debug, PartialEq)]
pub struct Diagnostic {
    /// Whether it stops the policy from loading.
    pub severity: Severity,
    /// A stable identifier such as `unknown-key`.
    pub code: &'static str,
    /// One lowercase line, user input in backticks.
    pub message: String,
    /// How to fix it.
    pub help: Option<String>,
    /// Where it is; `None` for findings about a whole file that has no text (unreadable).
    pub span: Option<Span>,
    /// The text under the underline.
    pub label: Option<String>,
    /// Text inside the span to point at precisely (a placeholder inside a string, say).
    pub focus: Option<String>,
}

impl Diagnostic {
    /// An error with `code` (a stable identifier such as `unknown-key`) at `span`.
    pub fn error(code: &'static str, span: Span, message: impl Into<String>) -> Self {
        Diagnostic {
            severity: Severity::Error,
            code,
            message: message.into(),
            help: None,
            span: Some(span),
            label: None,
            focus: None,
        }
    }

    /// A warning with `code` at `span`.
    pub fn warning(code: &'static str, span: Span, message: impl Into<String>) -> Self {
        Diagnostic {
            severity: Severity::Warning,
            ..Diagnostic::error(code, span, message)
        }
    }

    /// Adds how to fix it.
    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    /// Adds the text shown under the underline.
    pub fn with_label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// Narrows the underline to this text inside the span, where it is found.
    pub(crate) fn with_focus(mut self, focus: impl Into<String>) -> Self {
        self.focus = Some(focus.into());
        self
    }

    /// Whether the severity is [`Severity::Error`].
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

/// A loaded source file.
#[derive(Clone, Debug)]
pub struct Source {
    /// The path as given (or as resolved from an `extends`).
    pub path: PathBuf,
    /// The name shown in reports.
    pub name: String,
    /// The whole text as read.
    pub text: String,
    /// Whether diagnostics may quote the text: only files that declare themselves policies
    /// (a top-level `version: N` line) are shown, so that a path to some other file (`extends:
    /// /proc/self/environ`, a key file) never puts its contents on the screen or in a log.
    pub quoted: bool,
}

/// Whether `text` declares itself a loopguard policy: it has a top-level `version: N` line.
/// Every policy needs `version`, and other files (environment dumps, key files, `.env` files,
/// JSON credentials) do not have such a line.
pub(crate) fn declares_policy(text: &str) -> bool {
    text.trim_start_matches('\u{feff}').lines().any(|line| {
        let Some(rest) = line.strip_prefix("version") else {
            return false;
        };
        let Some(rest) = rest.trim_start_matches([' ', '\t']).strip_prefix(':') else {
            return false;
        };
        let value = rest.split('#').next().unwrap_or_default().trim();
        !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit())
    })
}

/// Every file read while loading a policy, so that diagnostics can be rendered.
#[derive(Clone, Debug, Default)]
pub struct SourceMap {
    sources: Vec<Source>,
}

impl SourceMap {
    /// Records a file read while loading and returns its id for [`Span`]s.
    pub fn add(&mut self, path: &Path, text: String) -> SourceId {
        let id = SourceId(u32::try_from(self.sources.len()).unwrap_or(u32::MAX));
        self.sources.push(Source {
            path: path.to_path_buf(),
            name: path.display().to_string(),
            quoted: declares_policy(&text),
            text,
        });
        id
    }

    /// The file with this id; `None` for an id from another map.
    pub fn get(&self, id: SourceId) -> Option<&Source> {
        self.sources.get(id.0 as usize)
    }

    /// The id of the file read from `path` (compared as given, not canonicalized).
    pub fn find(&self, path: &Path) -> Option<SourceId> {
        self.sources
            .iter()
            .position(|s| s.path == path)
            .and_then(|i| u32::try_from(i).ok())
            .map(SourceId)
    }

    /// The span of a diagnostic, narrowed to its focus text when that is found inside it.
    pub(crate) fn span_of(&self, diag: &Diagnostic) -> Option<Span> {
        let span = diag.span?;
        let (Some(focus), Some(src)) = (&diag.focus, self.get(span.source)) else {
            return Some(span);
        };
        let end = span
            .offset
            .saturating_add(span.len.max(1))
            .min(src.text.len());
        let Some(window) = src.text.get(span.offset..end) else {
            return Some(span);
        };
        let Some(at) = window.find(focus.as_str()) else {
            return Some(span);
        };
        let offset = span.offset + at;
        let before = &src.text[..offset];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let column = before[line_start..].chars().count() + 1;
        Some(Span {
            source: span.source,
            offset,
            len: focus.len(),
            line: u32::try_from(line).unwrap_or(span.line),
            column: u32::try_from(column).unwrap_or(span.column),
        })
    }

    /// `file:line:col` of a span.
    pub(crate) fn location(&self, span: Span) -> String {
        let name = self
            .get(span.source)
            .map_or("<unknown>", |s| s.name.as_str());
        format!("{name}:{}:{}", span.line, span.column)
    }

    /// Renders a diagnostic as miette draws it: header, snippet with underline, help.
    pub fn render(&self, diag: &Diagnostic) -> String {
        let rendered = Rendered::new(self, diag);
        let mut out = String::new();
        let handler = GraphicalReportHandler::new_themed(GraphicalTheme::unicode_nocolor())
            .with_width(100)
            .with_context_lines(1);
        if handler.render_report(&mut out, &rendered).is_err() {
            out = format!("{}: {}", diag.severity.as_str(), diag.message);
        }
        out
    }

    /// Renders a diagnostic as one JSON object (for `--error-format json`).
    pub fn to_json(&self, diag: &Diagnostic) -> serde_json::Value {
        let (file, line, column, offset, len) = match self.span_of(diag) {
            Some(span) => (
                self.get(span.source).map(|s| s.name.clone()),
                Some(span.line),
                Some(span.column),
                Some(span.offset),
                Some(span.len),
            ),
            None => (None, None, None, None, None),
        };
        serde_json::json!({
            "severity": diag.severity.as_str(),
            "code": diag.code,
            "message": diag.message,
            "help": diag.help,
            "file": file,
            "line": line,
            "column": column,
            "offset": offset,
            "length": len,
            "label": diag.label,
        })
    }
}

/// A diagnostic paired with its source text, in the shape miette renders.
struct Rendered {
    message: String,
    code: String,
    help: Option<String>,
    severity: miette::Severity,
    source: Option<Excerpt>,
    span: Option<(SourceSpan, Option<String>)>,
}

impl Rendered {
    fn new(map: &SourceMap, diag: &Diagnostic) -> Self {
        let mut message = diag.message.clone();
        let mut help = diag.help.clone();
        let mut located = None;
        if let Some(span) = map.span_of(diag)
            && let Some(src) = map.get(span.source)
        {
            if src.quoted {
                located = Some(Excerpt::new(src, span));
            } else {
                // The place is still given, the text is not.
                message = format!("{message}\nat {}", map.location(span));
                let note = "the file is not quoted: it has no top-level `version:` line, so it \
                    may not be a loopguard policy";
                help = Some(match help {
                    Some(h) => format!("{h}\n{note}"),
                    None => note.to_owned(),
                });
            }
        }
        let (source, span) = match located {
            Some((excerpt, span)) => (Some(excerpt), Some((span, diag.label.clone()))),
            None => (None, None),
        };
        Rendered {
            message,
            code: format!("loopguard::{}", diag.code),
            help,
            severity: match diag.severity {
                Severity::Error => miette::Severity::Error,
                Severity::Warning => miette::Severity::Warning,
            },
            source,
            span,
        }
    }
}

/// Longest line, in characters, that a snippet shows whole.
pub(crate) const LONG_LINE: usize = 1_000;
/// Characters shown before the column on a line cut for a snippet (and twice that in all).
pub(crate) const LONG_LINE_WINDOW: usize = 60;

/// The lines a snippet shows, cut from a source: the span's lines and one line of context on
/// each side. A line longer than [`LONG_LINE`] is shown as a window around the column, so a
/// snippet stays small however long the line; line numbers and the column in the header are
/// those of the whole file.
struct Excerpt {
    name: String,
    text: String,
    /// 0-based line of the file where `text` starts.
    first_line: usize,
    /// When a line was cut: the span in `text`, and its true 0-based line and column, for the
    /// header.
    cut: Option<(SourceSpan, usize, usize)>,
}

impl Excerpt {
    /// The excerpt around `span` of `src`, and the span within it.
    fn new(src: &Source, span: Span) -> (Excerpt, SourceSpan) {
        let text = src.text.as_str();
        // Point at one character at least, and never past the end of the text.
        let mut start = span.offset.min(text.len());
        while !text.is_char_boundary(start) {
            start -= 1;
        }
        let mut end = start
            .saturating_add(span.len.max(1))
            .min(text.len())
            .max(start);
        while !text.is_char_boundary(end) {
            end += 1;
        }
        let line_start = |at: usize| text[..at].rfind('\n').map_or(0, |i| i + 1);
        let line_end = |at: usize| text[at..].find('\n').map_or(text.len(), |i| at + i);
        let first = line_start(start);
        let from = if first == 0 { 0 } else { line_start(first - 1) };
        // The last character of the span, to find the line it ends on.
        let mut last = end.saturating_sub(1).max(start);
        while !text.is_char_boundary(last) {
            last -= 1;
        }
        let last_end = line_end(last);
        let to = if last_end >= text.len() {
            text.len()
        } else {
            line_end(last_end + 1)
        };
        let first_line = text[..from].bytes().filter(|&b| b == b'\n').count();
        let window = &text[from..to];
        let long = window
            .split('\n')
            .any(|l| l.len() > LONG_LINE && l.chars().count() > LONG_LINE);
        if !long {
            let excerpt = Excerpt {
                name: src.name.clone(),
                text: window.to_owned(),
                first_line,
                cut: None,
            };
            return (excerpt, SourceSpan::new((start - from).into(), end - start));
        }
        // Cut every long line of the span's first line and its neighbours to the same columns.
        let column = text[first..start].chars().count();
        let skip = column.saturating_sub(LONG_LINE_WINDOW);
        let take = 2 * LONG_LINE_WINDOW;
        let own_end = line_end(start);
        let from = if first == 0 { 0 } else { line_start(first - 1) };
        let to = if own_end >= text.len() {
            text.len()
        } else {
            line_end(own_end + 1)
        };
        let mut out = String::new();
        let mut primary = SourceSpan::new(0.into(), 0);
        let mut at = from;
        for (i, line) in text[from..to].split('\n').enumerate() {
            if i > 0 {
                out.push('\n');
            }
            let is_primary = at == first;
            if line.chars().count() <= LONG_LINE {
                if is_primary {
                    let len = end.min(own_end).saturating_sub(start).max(1);
                    primary = SourceSpan::new((out.len() + start - first).into(), len);
                }
                out.push_str(line);
            } else {
                if skip > 0 {
                    out.push('…');
                }
                let base = out.len();
                let shown: String = line.chars().skip(skip).take(take).collect();
                out.push_str(&shown);
                if line.chars().count() > skip + take {
                    out.push('…');
                }
                if is_primary {
                    let offset: usize = shown.chars().take(column - skip).map(char::len_utf8).sum();
                    let span_chars = text[start..end.min(own_end).max(start)].chars().count();
                    let len: usize = shown
                        .chars()
                        .skip(column - skip)
                        .take(span_chars.max(1))
                        .map(char::len_utf8)
                        .sum();
                    primary = SourceSpan::new((base + offset).into(), len.max(1));
                }
            }
            at += line.len() + 1;
        }
        let true_line = first_line + usize::from(first != from);
        let excerpt = Excerpt {
            name: src.name.clone(),
            text: out,
            first_line,
            cut: Some((primary, true_line, column)),
        };
        (excerpt, primary)
    }
}

impl SourceCode for Excerpt {
    fn read_span<'a>(
        &'a self,
        span: &SourceSpan,
        context_lines_before: usize,
        context_lines_after: usize,
    ) -> Result<Box<dyn SpanContents<'a> + 'a>, MietteError> {
        let inner = self
            .text
            .read_span(span, context_lines_before, context_lines_after)?;
        let (line, column) = match self.cut {
            Some((primary, line, column))
                if context_lines_before == 0 && span.offset() == primary.offset() =>
            {
                (line, column)
            }
            _ => (inner.line() + self.first_line, inner.column()),
        };
        Ok(Box::new(MietteSpanContents::new_named(
            self.name.clone(),
            inner.data(),
            *inner.span(),
            line,
            column,
            inner.line_count(),
        )))
    }
}

impl fmt::Debug for Rendered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl fmt::Display for Rendered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Rendered {}

impl miette::Diagnostic for Rendered {
    fn code<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        Some(Box::new(&self.code))
    }
    fn severity(&self) -> Option<miette::Severity> {
        Some(self.severity)
    }
    fn help<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        self.help
            .as_ref()
            .map(|h| Box::new(h) as Box<dyn fmt::Display + 'a>)
    }
    fn source_code(&self) -> Option<&dyn SourceCode> {
        self.source.as_ref().map(|s| s as &dyn SourceCode)
    }
    fn labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
        let (span, label) = self.span.clone()?;
        Some(Box::new(std::iter::once(LabeledSpan::new_with_span(
            label, span,
        ))))
    }
}

/// The nearest of `candidates` to `word`, when it is close enough to be a likely typo.
pub(crate) fn did_you_mean<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (strsim::jaro_winkler(word, c), c))
        .filter(|(score, _)| *score >= 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn map(text: &str) -> SourceMap {
        let mut map = SourceMap::default();
        map.add(Path::new("p.yaml"), text.to_owned());
        map
    }

    fn at(offset: usize, len: usize, line: u32, column: u32) -> Diagnostic {
        let span = Span {
            source: SourceId(0),
            offset,
            len,
            line,
            column,
        };
        Diagnostic::error("test", span, "test").with_label("here")
    }

    /// miette panics drawing a label past column 65,535; a long line is shown as a window.
    #[test]
    fn a_long_line_renders_as_a_window_with_the_true_line_and_column() {
        let text = format!("version: 1\nname: {}!\nx: 1\n", "é".repeat(80_000));
        let offset = text.find('!').unwrap();
        let out = map(&text).render(&at(offset, 1, 2, 80_007));
        assert!(out.contains("[p.yaml:2:80007]"), "{out}");
        assert!(out.contains(" 2 │ …éé"), "{out}");
        assert!(out.contains(" 3 │ x: 1"), "{out}");
        assert!(out.lines().all(|l| l.chars().count() < 200), "{out}");
    }

    #[test]
    fn rendering_never_panics_whatever_the_span() {
        let text = format!(
            "version: 1\r\n{}\r\nkey: \"ü\"\n{}\n\n",
            "ab€".repeat(30_000),
            "z".repeat(70_000)
        );
        let sources = map(&text);
        let len = text.len();
        let offsets =
            (0..len)
                .step_by(997)
                .chain([0, 1, 11, 12, 13, len - 2, len - 1, len, len + 5]);
        for offset in offsets {
            for span_len in [0, 1, 2, 5, 40_000, usize::MAX / 2] {
                let out = sources.render(&at(offset, span_len, 1, 1));
                assert!(out.contains("loopguard::test"), "{out}");
                assert!(
                    out.lines().all(|l| l.chars().count() < 400),
                    "{offset}: {out}"
                );
            }
        }
    }

    #[test]
    fn only_files_that_declare_a_version_are_quoted() {
        assert!(declares_policy("# a policy\nversion: 1\n"));
        assert!(declares_policy("\u{feff}version:   12  # comment\n"));
        assert!(!declares_policy("API_KEY=sk-1\nversion=1\n"));
        assert!(!declares_policy("  version: 1\n"));
        assert!(!declares_policy("version: \"3\"\n"));
        assert!(!declares_policy("{\"version\": 1}"));
        let out = map("API_KEY=sk-secret\n").render(&at(0, 3, 1, 1));
        assert!(!out.contains("sk-secret"), "{out}");
        assert!(out.contains("at p.yaml:1:1"), "{out}");
    }
}
