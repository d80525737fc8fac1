//! Errors and warnings about a policy, each tied to a place in a source file.

use std::fmt;
use std::path::{Path, PathBuf};

use miette::{GraphicalReportHandler, GraphicalTheme, LabeledSpan, NamedSource, SourceSpan};

use crate::node::{SourceId, Span};

/// How serious a diagnostic is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    Warning,
    Error,
}

impl Severity {
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

    pub fn warning(code: &'static str, span: Span, message: impl Into<String>) -> Self {
        Diagnostic {
            severity: Severity::Warning,
            ..Diagnostic::error(code, span, message)
        }
    }

    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    pub fn with_label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    pub fn with_focus(mut self, focus: impl Into<String>) -> Self {
        self.focus = Some(focus.into());
        self
    }

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
    pub text: String,
}

/// Every file read while loading a policy, so that diagnostics can be rendered.
#[derive(Clone, Debug, Default)]
pub struct SourceMap {
    sources: Vec<Source>,
}

impl SourceMap {
    pub fn add(&mut self, path: &Path, text: String) -> SourceId {
        let id = SourceId(u32::try_from(self.sources.len()).unwrap_or(u32::MAX));
        self.sources.push(Source {
            path: path.to_path_buf(),
            name: path.display().to_string(),
            text,
        });
        id
    }

    pub fn get(&self, id: SourceId) -> Option<&Source> {
        self.sources.get(id.0 as usize)
    }

    pub fn find(&self, path: &Path) -> Option<SourceId> {
        self.sources
            .iter()
            .position(|s| s.path == path)
            .and_then(|i| u32::try_from(i).ok())
            .map(SourceId)
    }

    /// The span of a diagnostic, narrowed to its focus text when that is found inside it.
    pub fn span_of(&self, diag: &Diagnostic) -> Option<Span> {
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
    pub fn location(&self, span: Span) -> String {
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
    source: Option<NamedSource<String>>,
    span: Option<(SourceSpan, Option<String>)>,
}

impl Rendered {
    fn new(map: &SourceMap, diag: &Diagnostic) -> Self {
        let located = map.span_of(diag).and_then(|span| {
            let src = map.get(span.source)?;
            // Point at one character at least, and never past the end of the text.
            let offset = span.offset.min(src.text.len());
            let len = span.len.max(1).min(src.text.len().saturating_sub(offset));
            Some((
                NamedSource::new(src.name.clone(), src.text.clone()),
                SourceSpan::new(offset.into(), len),
            ))
        });
        let (source, span) = match located {
            Some((source, span)) => (Some(source), Some((span, diag.label.clone()))),
            None => (None, None),
        };
        Rendered {
            message: diag.message.clone(),
            code: format!("loopguard::{}", diag.code),
            help: diag.help.clone(),
            severity: match diag.severity {
                Severity::Error => miette::Severity::Error,
                Severity::Warning => miette::Severity::Warning,
            },
            source,
            span,
        }
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
    fn source_code(&self) -> Option<&dyn miette::SourceCode> {
        self.source.as_ref().map(|s| s as &dyn miette::SourceCode)
    }
    fn labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
        let (span, label) = self.span.clone()?;
        Some(Box::new(std::iter::once(LabeledSpan::new_with_span(
            label, span,
        ))))
    }
}

/// The nearest of `candidates` to `word`, when it is close enough to be a likely typo.
pub fn did_you_mean<'a>(
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
