//! `loopctl`: check loopguard policies, print their schema, replay transcripts through them.

mod simulate;
mod transcript;
mod validate;

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

/// Exit code: everything checked is valid / nothing to report.
pub const EXIT_OK: u8 = 0;
/// Exit code: the input is invalid (a policy with errors, a malformed transcript).
pub const EXIT_INVALID: u8 = 1;
/// Exit code: the command could not run (missing file, unreadable input).
pub const EXIT_CANNOT_RUN: u8 = 2;
/// Exit code of `simulate`: the policy intervened at least once.
pub const EXIT_INTERVENED: u8 = 3;

#[derive(Debug, Parser)]
#[command(
    name = "loopctl",
    version,
    about = "loopguard: catch tool-call loops of LLM agents"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ErrorFormat {
    Human,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check policy files (or every .yaml/.yml file in directories) and report every problem.
    ///
    /// Exit status: 0 when valid, 1 when invalid, 2 when a file could not be read.
    Validate {
        /// Policy files or directories.
        #[arg(required = true)]
        paths: Vec<std::path::PathBuf>,
        /// How to print diagnostics.
        #[arg(long, value_enum, default_value = "human")]
        error_format: ErrorFormat,
        /// Treat warnings as errors.
        #[arg(long)]
        deny_warnings: bool,
    },
    /// Print the JSON Schema of the policy format (for editors such as yaml-language-server).
    Schema {
        /// Print the Markdown rule reference instead.
        #[arg(long, conflicts_with = "events")]
        reference: bool,
        /// Print the JSON Schema of one line of the loopguard event format instead.
        #[arg(long)]
        events: bool,
    },
    /// Replay recorded conversations through a policy and show where and why it intervenes.
    ///
    /// Transcripts are loopguard event JSON Lines, OpenAI chat-completions messages (an array,
    /// JSON Lines, or a request body with `messages`) or Anthropic messages, detected from the
    /// content. Exit status: 0 when the policy never intervened, 3 when it did, 1 on bad input
    /// (a malformed transcript or policy), 2 when a file could not be read.
    Simulate {
        /// Transcript files.
        #[arg(required = true)]
        transcripts: Vec<std::path::PathBuf>,
        /// The policy file; default: the built-in `rules/default.yaml`.
        #[arg(long, value_name = "FILE")]
        rules: Option<std::path::PathBuf>,
        /// Apply the policy's overrides for this backend.
        #[arg(long)]
        backend: Option<String>,
        /// Apply the policy's overrides for this model.
        #[arg(long)]
        model: Option<String>,
        /// Print one JSON object per intervention, one per line, and nothing else.
        #[arg(long)]
        json: bool,
        /// Print only the interventions, not every tool call.
        #[arg(long, short)]
        quiet: bool,
    },
}

/// Writes to standard output; a closed pipe (`loopctl … | head`) is not an error.
pub fn emit(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Validate {
            paths,
            error_format,
            deny_warnings,
        } => validate::run(&paths, error_format, deny_warnings),
        Command::Simulate {
            transcripts,
            rules,
            backend,
            model,
            json,
            quiet,
        } => simulate::run(
            &transcripts,
            &simulate::Options {
                rules,
                backend,
                model,
                json,
                quiet,
            },
        ),
        Command::Schema { reference, events } => {
            if events {
                emit(&format!(
                    "{}\n",
                    serde_json::to_string_pretty(&transcript::event_schema()).unwrap_or_default()
                ));
            } else if reference {
                emit(&loopguard_rules::generate::reference_markdown());
            } else {
                let schema = loopguard_rules::generate::json_schema();
                emit(&format!(
                    "{}\n",
                    serde_json::to_string_pretty(&schema).unwrap_or_default()
                ));
            }
            EXIT_OK
        }
    };
    ExitCode::from(code)
}
