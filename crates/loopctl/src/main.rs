//! `loopctl`: check loopguard policies, print their schema, replay transcripts through them.

mod validate;

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

/// Exit code: everything checked is valid / nothing to report.
pub const EXIT_OK: u8 = 0;
/// Exit code: the input is invalid (a policy with errors, a malformed transcript).
pub const EXIT_INVALID: u8 = 1;
/// Exit code: the command could not run (missing file, unreadable input).
pub const EXIT_CANNOT_RUN: u8 = 2;

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
        #[arg(long)]
        reference: bool,
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
        Command::Schema { reference } => {
            if reference {
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
