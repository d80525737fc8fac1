use std::path::PathBuf;

/// Why a plugin could not be loaded. Every message names the library file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HostError {
    /// The path names no file.
    #[error("plugin `{}` not found", path.display())]
    NotFound {
        /// The path as given.
        path: PathBuf,
    },

    /// The file is not one this host loads: not a regular file (a directory, a FIFO, a device,
    /// a socket), group- or world-writable, or in a group- or world-writable directory. Checked
    /// before the file is opened.
    #[error("plugin `{}` refused: {reason}", path.display())]
    Refused {
        /// The path as given.
        path: PathBuf,
        /// Why, naming the resolved file or directory when that is what was refused.
        reason: String,
    },

    /// The file exists but the dynamic loader refused it (not a shared library, wrong
    /// architecture, missing dependency).
    #[error("plugin `{}` is not a loadable library: {source}", path.display())]
    NotALibrary {
        /// The library file.
        path: PathBuf,
        /// The loader's error.
        #[source]
        source: libloading::Error,
    },

    /// A symbol every plugin must export is missing.
    #[error(
        "plugin `{}` does not export `{symbol}`: is it a loopguard plugin?",
        path.display()
    )]
    MissingSymbol {
        /// The library file.
        path: PathBuf,
        /// The missing symbol's name.
        symbol: &'static str,
        /// The loader's error.
        #[source]
        source: libloading::Error,
    },

    /// The plugin was built for another version of the plugin ABI.
    #[error(
        "plugin `{}` was built for plugin ABI version {found}, but this loopguard speaks version {expected}: rebuild the plugin against loopguard-plugin-sdk for ABI {expected}",
        path.display()
    )]
    AbiMismatch {
        /// The library file.
        path: PathBuf,
        /// The ABI version the plugin reports.
        found: u32,
        /// This host's ABI version.
        expected: u32,
    },

    /// The descriptor is smaller than the fields this host reads.
    #[error(
        "plugin `{}` has a descriptor of {size} bytes, this host needs at least {needed}",
        path.display()
    )]
    DescriptorTooSmall {
        /// The library file.
        path: PathBuf,
        /// The descriptor's `struct_size`, in bytes.
        size: usize,
        /// The smallest size this host reads, in bytes.
        needed: usize,
    },

    /// The descriptor is malformed: null, a null function, text that is not UTF-8, a schema that
    /// is not a JSON Schema.
    #[error("plugin `{}` has an invalid descriptor: {reason}", path.display())]
    BadDescriptor {
        /// The library file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },

    /// The policy's `config` for the plugin does not match the plugin's JSON Schema.
    #[error(
        "invalid configuration for plugin `{plugin}` ({}): {}",
        path.display(),
        errors.join("; ")
    )]
    BadConfig {
        /// The library file.
        path: PathBuf,
        /// The plugin's name.
        plugin: String,
        /// One entry per violation: `<json pointer>: <what is wrong>`.
        errors: Vec<String>,
    },

    /// The plugin's `create` refused the configuration or failed.
    #[error(
        "plugin `{plugin}` ({}) failed to start (status {status}): {message}",
        path.display()
    )]
    CreateFailed {
        /// The library file.
        path: PathBuf,
        /// The plugin's name.
        plugin: String,
        /// The status `create` returned (see `loopguard_plugin_abi::status`).
        status: i32,
        /// The plugin's error message; empty when it gave none.
        message: String,
    },
}
