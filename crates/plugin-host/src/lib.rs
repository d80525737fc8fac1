//! Loads loopguard detector plugins (shared libraries speaking `loopguard-plugin-abi`) and calls
//! them safely.
//!
//! This crate is the one place in loopguard where `unsafe` lives, and it keeps its promises in
//! the order the ABI dictates:
//!
//! 1. **Version first.** [`PluginHost::load`] resolves `loopguard_plugin_abi_version` before
//!    anything else and refuses a library built for another ABI, naming the file and both
//!    versions ([`HostError::AbiMismatch`]).
//! 2. **Descriptor size.** The descriptor's first field is its size; a descriptor smaller than the
//!    fields this host reads is refused.
//! 3. **Config checked before the plugin sees it**, against the JSON Schema the plugin publishes;
//!    every violation is listed ([`HostError::BadConfig`]).
//! 4. **Panics poison.** A plugin reporting `PANICKED` is never called again: every later
//!    [`Plugin::on_event`] returns [`Outcome::Poisoned`] without entering it, and its instance is
//!    leaked rather than destroyed.
//! 5. **Serialized unless declared thread-safe**: calls into a plugin without the `THREAD_SAFE`
//!    flag go through a mutex, so [`Plugin`] is `Send + Sync` either way.
//! 0. **Only safe files are opened.** Before the loader sees it, the path (a symlink is
//!    resolved and its target checked) must name a regular file that is neither group- nor
//!    world-writable, in a directory that is neither group- nor world-writable (sticky or not):
//!    loading a library runs its code, so nobody but its owner may be able to change it or swap
//!    it. Anything else — a FIFO, a device, a directory — is refused without being opened
//!    ([`HostError::Refused`], naming the path and the reason).
//! 6. **Never unloaded.** Libraries stay mapped for the life of the process (unloading a library
//!    that registered thread-locals or destructors crashes later, far from the cause), even when
//!    loading fails after the library was opened.
//!
//! ```no_run
//! use loopguard_plugin_host::{EventKind, EventView, Outcome, PluginHost};
//!
//! let plugin = PluginHost::load(
//!     "target/release/libloopguard_plugin_similarity.so".as_ref(),
//!     &serde_json::json!({ "threshold": 0.85 }),
//! )?;
//! let ev = EventView::new(EventKind::Call, "session-1", 1_000)
//!     .tool("search")
//!     .arguments(r#"{"query":"foo"}"#)
//!     .fingerprints(0x1234, 0x5678);
//! match plugin.on_event(&ev) {
//!     Outcome::Detection { count, message, .. } => println!("{count}: {message}"),
//!     Outcome::NoDetection => {}
//!     Outcome::Poisoned => eprintln!("plugin `{}` panicked earlier", plugin.name()),
//!     Outcome::Error(code) => eprintln!("plugin `{}` failed: status {code}", plugin.name()),
//! }
//! # Ok::<(), loopguard_plugin_host::HostError>(())
//! ```

#![warn(missing_docs)]
#![allow(unsafe_code)]

mod error;

use std::ffi::c_void;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

pub use error::HostError;
/// The C ABI (re-exported so the engine needs one dependency).
pub use loopguard_plugin_abi as abi;
use loopguard_plugin_abi::{
    AbiVersionFn, DescriptorFn, DestroyFn, DetectionOut, FreeBufferFn, LOOPGUARD_ABI_VERSION,
    OnEventFn, OwnedBuf, PluginDescriptor, StrRef, WindowRecord, status,
};

/// Loads plugins. (A namespace today; it is where a registry of loaded libraries would live.)
#[derive(Debug, Default, Clone, Copy)]
pub struct PluginHost;

impl PluginHost {
    /// Loads the plugin at `path` and creates an instance configured with `config` (`null` for
    /// none).
    ///
    /// The library is never unloaded, whatever the outcome. Relative paths are resolved against
    /// the current directory (never searched for on the loader's library path); the policy layer
    /// resolves them against the policy file first.
    pub fn load(path: &Path, config: &serde_json::Value) -> Result<Plugin, HostError> {
        let (path, desc) = Self::open(path)?;
        Plugin::create(path, &desc, config)
    }

    /// Reads what a plugin says about itself (name, version, flags, config schema) without
    /// creating an instance: the ABI version and descriptor checks of [`PluginHost::load`], no
    /// configuration. The library stays loaded, as always.
    pub fn describe(path: &Path) -> Result<PluginInfo, HostError> {
        let (path, desc) = Self::open(path)?;
        let name = descriptor_text(&path, "name", desc.name)?;
        let version = descriptor_text(&path, "version", desc.version)?;
        let config_schema = parse_schema(
            &path,
            &descriptor_text(&path, "config_schema", desc.config_schema)?,
        )?;
        Ok(PluginInfo {
            path,
            name,
            version,
            abi_version: desc.abi_version,
            thread_safe: desc.flags & abi::flags::THREAD_SAFE != 0,
            config_schema,
        })
    }

    /// Opens the library, checks its ABI version, then reads and checks its descriptor.
    fn open(path: &Path) -> Result<(PathBuf, PluginDescriptor), HostError> {
        let path = checked_file(path)?;
        // SAFETY: loading a library runs its initializers. That is the trust the policy grants by
        // naming this path: plugins are loaded only from paths a policy names.
        let library = unsafe { libloading::Library::new(&path) }.map_err(|source| {
            HostError::NotALibrary {
                path: path.clone(),
                source,
            }
        })?;
        // Never unloaded: see the crate docs.
        let library: &'static libloading::Library = Box::leak(Box::new(library));

        // 1. The version, before anything else.
        // SAFETY: the symbol is declared by the ABI as `AbiVersionFn`; if the library lies about
        // its type, no Rust-level check could tell.
        let version_fn =
            unsafe { library.get::<AbiVersionFn>(abi::ABI_VERSION_SYMBOL.to_bytes_with_nul()) }
                .map_err(|source| HostError::MissingSymbol {
                    path: path.clone(),
                    symbol: "loopguard_plugin_abi_version",
                    source,
                })?;
        // SAFETY: an `AbiVersionFn` takes nothing and only returns a constant.
        let found = unsafe { version_fn() };
        if found != LOOPGUARD_ABI_VERSION {
            return Err(HostError::AbiMismatch {
                path,
                found,
                expected: LOOPGUARD_ABI_VERSION,
            });
        }

        // 2. The descriptor.
        // SAFETY: the symbol is declared by the ABI as `DescriptorFn` (version already agreed).
        let descriptor_fn =
            unsafe { library.get::<DescriptorFn>(abi::DESCRIPTOR_SYMBOL.to_bytes_with_nul()) }
                .map_err(|source| HostError::MissingSymbol {
                    path: path.clone(),
                    symbol: "loopguard_plugin_descriptor",
                    source,
                })?;
        // SAFETY: a `DescriptorFn` takes nothing and returns a static pointer (or null).
        let ptr = unsafe { descriptor_fn() };
        let desc = read_descriptor(&path, ptr)?;
        Ok((path, desc))
    }
}

/// The canonical path of `path` once it is known to be a file this host may load: a regular
/// file, not group- or world-writable, in a directory that is not group- or world-writable.
/// Only metadata is read: a FIFO is never opened (opening one would block).
pub(crate) fn checked_file(path: &Path) -> Result<PathBuf, HostError> {
    let refused = |path: &Path, reason: String| HostError::Refused {
        path: path.to_path_buf(),
        reason,
    };
    // `symlink_metadata` first: a missing file and a dangling symlink are both "not found".
    let link = std::fs::symlink_metadata(path)
        .map_err(|_| HostError::NotFound {
            path: path.to_path_buf(),
        })?
        .file_type()
        .is_symlink();
    let resolved = std::fs::canonicalize(path).map_err(|_| HostError::NotFound {
        path: path.to_path_buf(),
    })?;
    let meta = std::fs::metadata(&resolved).map_err(|_| HostError::NotFound {
        path: path.to_path_buf(),
    })?;
    // A symlink's target is named in the reason, since that is the file at fault.
    let shown = |p: &Path| {
        if link {
            format!(" `{}`", p.display())
        } else {
            String::new()
        }
    };
    let kind = meta.file_type();
    if !kind.is_file() {
        return Err(refused(
            path,
            format!(
                "it{} is a {}, not a regular file; it was not opened",
                if link { " links to a file that" } else { "" },
                file_kind(&kind)
            ),
        ));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = meta.permissions().mode();
        if mode & 0o022 != 0 {
            return Err(refused(
                path,
                format!(
                    "the library{} is {}-writable (mode {:03o}); only its owner may be able to change a plugin: `chmod go-w` it",
                    shown(&resolved),
                    writable_by(mode),
                    mode & 0o777
                ),
            ));
        }
        if let Some(dir) = resolved.parent() {
            let dmode = std::fs::metadata(dir)
                .map_err(|_| HostError::NotFound {
                    path: path.to_path_buf(),
                })?
                .permissions()
                .mode();
            if dmode & 0o022 != 0 {
                return Err(refused(
                    path,
                    format!(
                        "its directory `{}` is {}-writable (mode {:03o}), so others could replace the library: move it to a directory only its owner can write",
                        dir.display(),
                        writable_by(dmode),
                        dmode & 0o7777
                    ),
                ));
            }
        }
    }
    Ok(resolved)
}

/// Who besides the owner may write, per a Unix mode.
#[cfg(unix)]
fn writable_by(mode: u32) -> &'static str {
    match (mode & 0o020 != 0, mode & 0o002 != 0) {
        (true, true) => "group- and world",
        (false, true) => "world",
        _ => "group",
    }
}

/// What a file that is not a regular file is, in words.
fn file_kind(kind: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_fifo() {
            return "FIFO (named pipe)";
        }
        if kind.is_char_device() || kind.is_block_device() {
            return "device";
        }
        if kind.is_socket() {
            return "socket";
        }
    }
    if kind.is_dir() {
        "directory"
    } else {
        "special file"
    }
}

/// What a plugin says about itself ([`PluginHost::describe`]).
#[derive(Clone, Debug, PartialEq)]
pub struct PluginInfo {
    /// The library file, canonicalized.
    pub path: PathBuf,
    /// The plugin's name, from its descriptor.
    pub name: String,
    /// The plugin's own version text, from its descriptor.
    pub version: String,
    /// The plugin ABI version it was built for (always this host's: others are refused).
    pub abi_version: u32,
    /// Whether it declared itself thread-safe (its calls are then not serialized).
    pub thread_safe: bool,
    /// The JSON Schema of its configuration (`true` when it publishes none).
    pub config_schema: serde_json::Value,
}

/// Parses a plugin's config schema text (empty means "anything goes").
fn parse_schema(path: &Path, text: &str) -> Result<serde_json::Value, HostError> {
    if text.trim().is_empty() {
        return Ok(serde_json::Value::Bool(true));
    }
    serde_json::from_str(text).map_err(|e| HostError::BadDescriptor {
        path: path.to_path_buf(),
        reason: format!("its config schema is not JSON: {e}"),
    })
}

/// Reads a descriptor, checking its size before reading past the first field.
fn read_descriptor(
    path: &Path,
    ptr: *const PluginDescriptor,
) -> Result<PluginDescriptor, HostError> {
    let bad = |reason: &str| HostError::BadDescriptor {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    };
    if ptr.is_null() {
        return Err(bad("`loopguard_plugin_descriptor` returned null"));
    }
    if !ptr.cast::<usize>().is_aligned() {
        return Err(bad("the descriptor is misaligned"));
    }
    // SAFETY: non-null and aligned; the ABI makes `struct_size: usize` the first field of every
    // descriptor version, so reading one `usize` is in bounds whatever version wrote it.
    let size = unsafe { ptr.cast::<usize>().read() };
    let needed = abi::PLUGIN_DESCRIPTOR_MIN_SIZE;
    if size < needed {
        return Err(HostError::DescriptorTooSmall {
            path: path.to_path_buf(),
            size,
            needed,
        });
    }
    let full = std::mem::size_of::<PluginDescriptor>();
    let desc = if size >= full {
        // SAFETY: the plugin declares every field this host knows; the descriptor is static and
        // immutable per the ABI.
        unsafe { ptr.read() }
    } else {
        // An older, shorter descriptor: copy the bytes it has over an all-null one. Zero is a
        // valid value of every field (integers, null text, `None` functions).
        // SAFETY: every field of `PluginDescriptor` is valid when zeroed (see above).
        let mut desc: PluginDescriptor = unsafe { std::mem::zeroed() };
        // SAFETY: the plugin declares `size` readable bytes at `ptr` (static per the ABI), and
        // `size < full` fits in `desc`; the regions do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(ptr.cast::<u8>(), (&raw mut desc).cast::<u8>(), size);
        }
        desc
    };
    if desc.abi_version != LOOPGUARD_ABI_VERSION {
        return Err(HostError::AbiMismatch {
            path: path.to_path_buf(),
            found: desc.abi_version,
            expected: LOOPGUARD_ABI_VERSION,
        });
    }
    Ok(desc)
}

/// Copies static descriptor text.
fn descriptor_text(path: &Path, what: &str, text: StrRef) -> Result<String, HostError> {
    if text.len == 0 {
        return Ok(String::new());
    }
    if text.ptr.is_null() {
        return Err(HostError::BadDescriptor {
            path: path.to_path_buf(),
            reason: format!("`{what}` is null with length {}", text.len),
        });
    }
    // SAFETY: descriptor text is `len` readable bytes at a non-null `ptr`, static per the ABI.
    let bytes = unsafe { std::slice::from_raw_parts(text.ptr, text.len) };
    String::from_utf8(bytes.to_vec()).map_err(|_| HostError::BadDescriptor {
        path: path.to_path_buf(),
        reason: format!("`{what}` is not UTF-8"),
    })
}

/// A loaded, configured plugin instance.
///
/// `Send + Sync`: share it behind an `Arc`; calls are serialized unless the plugin declared itself
/// thread-safe. Dropping it destroys the instance (unless it panicked); the library stays loaded.
pub struct Plugin {
    path: PathBuf,
    name: String,
    version: String,
    config_schema: serde_json::Value,
    thread_safe: bool,
    reads_arguments: bool,
    instance: *mut c_void,
    on_event_fn: OnEventFn,
    destroy_fn: DestroyFn,
    free_buffer_fn: FreeBufferFn,
    wait_idle_fn: Option<abi::WaitIdleFn>,
    /// Serializes calls when the plugin is not thread-safe.
    lock: Mutex<()>,
    poisoned: AtomicBool,
}

// SAFETY: the instance pointer is only used through the plugin's functions. The ABI requires
// instances to be usable from any thread one call at a time (`Send`), which `Plugin` guarantees
// with `lock` unless the plugin declared THREAD_SAFE, in which case concurrent calls are allowed
// by contract. The library is never unloaded, so the function pointers stay valid.
unsafe impl Send for Plugin {}
// SAFETY: as for `Send`: `&Plugin` only offers `on_event` (serialized or declared thread-safe)
// and reads of immutable fields.
unsafe impl Sync for Plugin {}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("path", &self.path)
            .field("name", &self.name)
            .field("version", &self.version)
            .field("thread_safe", &self.thread_safe)
            .field("poisoned", &self.is_poisoned())
            .finish_non_exhaustive()
    }
}

/// What a plugin said about one event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing detected.
    NoDetection,
    /// A loop was detected.
    Detection {
        /// How many times the pattern has been seen, this event included.
        count: u32,
        /// Identifies the loop (stable across its events).
        key: u64,
        /// Message for the model / operator (lossily decoded if the plugin sent invalid UTF-8).
        message: String,
        /// Short description of what repeats.
        pattern: String,
    },
    /// The plugin panicked (in this call or an earlier one) and is no longer called.
    Poisoned,
    /// The plugin returned an error status, or one this host does not know.
    Error(i32),
}

impl Plugin {
    fn create(
        path: PathBuf,
        desc: &PluginDescriptor,
        config: &serde_json::Value,
    ) -> Result<Plugin, HostError> {
        let missing = |what: &str| HostError::BadDescriptor {
            path: path.clone(),
            reason: format!("the `{what}` function is null"),
        };
        let create_fn = desc.create.ok_or_else(|| missing("create"))?;
        let on_event_fn = desc.on_event.ok_or_else(|| missing("on_event"))?;
        let destroy_fn = desc.destroy.ok_or_else(|| missing("destroy"))?;
        let free_buffer_fn = desc.free_buffer.ok_or_else(|| missing("free_buffer"))?;
        let name = descriptor_text(&path, "name", desc.name)?;
        let version = descriptor_text(&path, "version", desc.version)?;
        let schema_text = descriptor_text(&path, "config_schema", desc.config_schema)?;

        let config_schema = parse_schema(&path, &schema_text)?;
        let validator =
            jsonschema::validator_for(&config_schema).map_err(|e| HostError::BadDescriptor {
                path: path.clone(),
                reason: format!("its config schema is not a valid JSON Schema: {e}"),
            })?;
        let errors: Vec<String> = validator
            .iter_errors(config)
            .map(|e| {
                let at = e.instance_path().to_string();
                let at = if at.is_empty() {
                    "config".to_string()
                } else {
                    format!("config{at}")
                };
                format!("{at}: {e}")
            })
            .collect();
        if !errors.is_empty() {
            return Err(HostError::BadConfig {
                path,
                plugin: name,
                errors,
            });
        }

        let config_text = config.to_string();
        let mut instance: *mut c_void = std::ptr::null_mut();
        let mut error = OwnedBuf::NULL;
        // SAFETY: `create_fn` comes from a descriptor of the agreed ABI version; the config text
        // is borrowed for the call; both out-pointers are valid and initialized.
        let rc = unsafe {
            create_fn(
                config_text.as_ptr(),
                config_text.len(),
                &mut instance,
                &mut error,
            )
        };
        if rc != status::OK {
            let message = if rc == status::PANICKED {
                // A panicked plugin is not called again, not even to free its buffer.
                "the plugin panicked".to_string()
            } else {
                // SAFETY: `error` was written by this plugin's `create` (or left null).
                let text = unsafe { take_buffer(free_buffer_fn, error) };
                if text.is_empty() {
                    "no message".to_string()
                } else {
                    text
                }
            };
            return Err(HostError::CreateFailed {
                path,
                plugin: name,
                status: rc,
                message,
            });
        }
        Ok(Plugin {
            path,
            name,
            version,
            config_schema,
            thread_safe: desc.flags & abi::flags::THREAD_SAFE != 0,
            reads_arguments: desc.flags & abi::flags::IGNORES_ARGUMENTS == 0,
            instance,
            on_event_fn,
            destroy_fn,
            free_buffer_fn,
            wait_idle_fn: desc.wait_idle,
            lock: Mutex::new(()),
            poisoned: AtomicBool::new(false),
        })
    }

    /// Shows the plugin one event.
    ///
    /// Returns [`Outcome::Poisoned`] without calling the plugin once it has panicked; the call in
    /// which it panicked returns `Poisoned` as well.
    pub fn on_event(&self, ev: &EventView<'_>) -> Outcome {
        if self.poisoned.load(Ordering::Acquire) {
            return Outcome::Poisoned;
        }
        let _guard =
            (!self.thread_safe).then(|| self.lock.lock().unwrap_or_else(PoisonError::into_inner));
        // Another thread may have poisoned it while we waited.
        if self.poisoned.load(Ordering::Acquire) {
            return Outcome::Poisoned;
        }
        let mut out = DetectionOut::EMPTY;
        // SAFETY: the instance came from this plugin's `create` and is alive (destroyed only on
        // drop); the view borrows data that outlives this call (`EventView<'_>`); `out` is valid
        // and initialized; calls are serialized unless the plugin declared THREAD_SAFE.
        let rc = unsafe { (self.on_event_fn)(self.instance, &ev.raw, &mut out) };
        match rc {
            status::PANICKED => {
                self.poisoned.store(true, Ordering::Release);
                Outcome::Poisoned
            }
            status::OK if out.detected != 0 => {
                // SAFETY: on OK the buffers were written by this plugin's `on_event` (or are null).
                let (message, pattern) = unsafe {
                    (
                        take_buffer(self.free_buffer_fn, out.message),
                        take_buffer(self.free_buffer_fn, out.pattern),
                    )
                };
                Outcome::Detection {
                    count: out.count,
                    key: out.key,
                    message,
                    pattern,
                }
            }
            other => {
                // SAFETY: buffers are null unless this plugin's `on_event` wrote them.
                unsafe {
                    take_buffer(self.free_buffer_fn, out.message);
                    take_buffer(self.free_buffer_fn, out.pattern);
                }
                if other == status::OK || other == status::NO_DETECTION {
                    Outcome::NoDetection
                } else {
                    Outcome::Error(other)
                }
            }
        }
    }

    /// Waits until the plugin's background work has finished or `timeout` passed (a no-op for
    /// plugins without background work). A panic poisons the plugin, as in [`Plugin::on_event`].
    pub fn wait_idle(&self, timeout: std::time::Duration) {
        let Some(wait) = self.wait_idle_fn else {
            return;
        };
        if self.poisoned.load(Ordering::Acquire) {
            return;
        }
        let _guard =
            (!self.thread_safe).then(|| self.lock.lock().unwrap_or_else(PoisonError::into_inner));
        if self.poisoned.load(Ordering::Acquire) {
            return;
        }
        let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        // SAFETY: as in `on_event`: a live instance of this plugin, calls serialized unless the
        // plugin declared THREAD_SAFE.
        let rc = unsafe { wait(self.instance, ms) };
        if rc == status::PANICKED {
            self.poisoned.store(true, Ordering::Release);
        }
    }

    /// Whether the plugin does background work that [`Plugin::wait_idle`] waits for.
    pub fn has_background_work(&self) -> bool {
        self.wait_idle_fn.is_some()
    }

    /// The plugin's own name (from its descriptor).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The plugin's version (from its descriptor).
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The library file, canonicalized.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The JSON Schema the plugin publishes for its configuration.
    pub fn config_schema(&self) -> &serde_json::Value {
        &self.config_schema
    }

    /// Whether the plugin reads the call arguments of an event (it did not declare
    /// `IGNORES_ARGUMENTS`).
    pub fn reads_arguments(&self) -> bool {
        self.reads_arguments
    }

    /// Whether the plugin has panicked and is no longer called.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::Acquire)
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        if self.is_poisoned() {
            // Its state is suspect; leak the instance rather than run its destructor.
            return;
        }
        // SAFETY: `&mut self` means no call is in flight; the instance came from `create` and is
        // destroyed exactly once, here.
        unsafe { (self.destroy_fn)(self.instance) };
    }
}

/// Copies a plugin-allocated buffer and gives it back to the plugin.
///
/// # Safety
/// `buf` is null or a buffer the plugin owning `free` handed out and nobody has freed.
unsafe fn take_buffer(free: FreeBufferFn, buf: OwnedBuf) -> String {
    if buf.ptr.is_null() {
        return String::new();
    }
    // SAFETY: per the ABI, `len` readable bytes at `ptr`, owned by us until freed below.
    let text = String::from_utf8_lossy(unsafe { std::slice::from_raw_parts(buf.ptr, buf.len) })
        .into_owned();
    // SAFETY: returned exactly once, with the pointer and length it was handed out with.
    unsafe { free(buf.ptr, buf.len) };
    text
}

/// The kind of an event shown to a plugin.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// The assistant calls a tool.
    Call,
    /// A tool's result.
    Result,
    /// Assistant text.
    Text,
    /// A user message.
    User,
    /// The session starts over.
    Reset,
}

impl EventKind {
    fn raw(self) -> u32 {
        use abi::event_kind as k;
        match self {
            EventKind::Call => k::CALL,
            EventKind::Result => k::RESULT,
            EventKind::Text => k::TEXT,
            EventKind::User => k::USER,
            EventKind::Reset => k::RESET,
        }
    }
}

/// A borrowed view of one event, built from Rust references, so the borrow checker enforces the
/// ABI's "valid for the duration of the call" rule. Building one allocates nothing.
///
/// Fields default to empty / zero; set those that apply to the kind (see
/// [`abi::EventView`]).
#[derive(Clone, Copy, Debug)]
pub struct EventView<'a> {
    raw: abi::EventView,
    _borrows: PhantomData<&'a str>,
}

impl<'a> EventView<'a> {
    /// An event of `kind` in `session` at `time_ms`.
    pub fn new(kind: EventKind, session: &'a str, time_ms: u64) -> Self {
        let mut raw = abi::EventView::empty(kind.raw());
        raw.session = StrRef::new(session);
        raw.time_ms = time_ms;
        EventView {
            raw,
            _borrows: PhantomData,
        }
    }

    /// The host's id of the call.
    pub fn call_id(mut self, call_id: &'a str) -> Self {
        self.raw.call_id = StrRef::new(call_id);
        self
    }

    /// The tool's name.
    pub fn tool(mut self, tool: &'a str) -> Self {
        self.raw.tool = StrRef::new(tool);
        self
    }

    /// The canonical arguments (JSON text).
    pub fn arguments(mut self, arguments: &'a str) -> Self {
        self.raw.arguments = StrRef::new(arguments);
        self
    }

    /// The tool's output, whether it failed, and its exit code if it has one.
    pub fn result(mut self, output: &'a str, is_error: bool, exit_code: Option<i32>) -> Self {
        self.raw.result = StrRef::new(output);
        self.raw.is_error = u8::from(is_error);
        self.raw.has_exit_code = u8::from(exit_code.is_some());
        self.raw.exit_code = exit_code.unwrap_or(0);
        self
    }

    /// Whether the call's tool runs shell commands.
    pub fn shell(mut self, is_shell: bool) -> Self {
        self.raw.is_shell = u8::from(is_shell);
        self
    }

    /// Whether the call was made before the previous call's result came back.
    pub fn batched(mut self, batched: bool) -> Self {
        self.raw.batched = u8::from(batched);
        self
    }

    /// Whether the call changes the world (and is not the same change again).
    pub fn changes(mut self, changes: bool) -> Self {
        self.raw.changes = u8::from(changes);
        self
    }

    /// Assistant or user text.
    pub fn text(mut self, text: &'a str) -> Self {
        self.raw.text = StrRef::new(text);
        self
    }

    /// The call's exact and fuzzy fingerprints.
    pub fn fingerprints(mut self, exact: u64, fuzzy: u64) -> Self {
        self.raw.exact = exact;
        self.raw.fuzzy = fuzzy;
        self
    }

    /// The digest of the normalized result.
    pub fn result_digest(mut self, digest: u64) -> Self {
        self.raw.result_digest = digest;
        self
    }

    /// The session's recent calls, oldest first, not including this event.
    pub fn window(mut self, window: &'a [WindowRecord]) -> Self {
        self.raw.window = if window.is_empty() {
            std::ptr::null()
        } else {
            window.as_ptr()
        };
        self.raw.window_len = window.len();
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn plugin_is_send_and_sync() {
        assert_send_sync::<Plugin>();
    }

    #[test]
    fn missing_file_is_not_found() {
        let err = PluginHost::load(Path::new("/no/such/plugin.so"), &serde_json::Value::Null)
            .unwrap_err();
        assert!(matches!(err, HostError::NotFound { .. }), "{err:?}");
        assert_eq!(err.to_string(), "plugin `/no/such/plugin.so` not found");
    }

    #[test]
    fn a_text_file_is_not_a_library() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
        let err = PluginHost::load(&path, &serde_json::Value::Null).unwrap_err();
        assert!(matches!(err, HostError::NotALibrary { .. }), "{err:?}");
        assert!(err.to_string().contains("Cargo.toml"), "{err}");
    }

    #[test]
    fn a_directory_is_refused_before_it_is_opened() {
        let err = PluginHost::load(
            Path::new(env!("CARGO_MANIFEST_DIR")),
            &serde_json::Value::Null,
        )
        .unwrap_err();
        assert!(matches!(err, HostError::Refused { .. }), "{err:?}");
        assert!(err.to_string().contains("is a directory"), "{err}");
    }

    #[cfg(unix)]
    #[test]
    fn a_fifo_is_refused_without_being_opened() {
        let dir = std::env::temp_dir().join(format!("loopguard-host-fifo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("libplugin.so");
        let _ = std::fs::remove_file(&fifo);
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success();
        assert!(made);
        // Opening a FIFO with no writer blocks: a refusal that returns proves it was not opened.
        let err = PluginHost::describe(&fifo).unwrap_err();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(matches!(err, HostError::Refused { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(
            msg.contains("FIFO") && msg.contains("libplugin.so"),
            "{msg}"
        );
    }

    #[test]
    fn writable_by_names_who_may_write() {
        #[cfg(unix)]
        {
            assert_eq!(writable_by(0o666), "group- and world");
            assert_eq!(writable_by(0o646), "world");
            assert_eq!(writable_by(0o664), "group");
        }
    }

    #[test]
    fn null_descriptor_is_refused() {
        let err = read_descriptor(Path::new("x.so"), std::ptr::null()).unwrap_err();
        assert!(err.to_string().contains("returned null"), "{err}");
    }

    #[test]
    fn small_descriptor_is_refused() {
        #[repr(C)]
        struct Old {
            struct_size: usize,
            abi_version: u32,
        }
        let old = Old {
            struct_size: std::mem::size_of::<Old>(),
            abi_version: LOOPGUARD_ABI_VERSION,
        };
        let err = read_descriptor(Path::new("x.so"), (&raw const old).cast()).unwrap_err();
        assert!(
            matches!(err, HostError::DescriptorTooSmall { size: 16, .. }),
            "{err:?}"
        );
        assert_eq!(old.abi_version, LOOPGUARD_ABI_VERSION);
    }

    #[test]
    fn abi_mismatch_names_file_and_both_versions() {
        let err = HostError::AbiMismatch {
            path: "/p/libx.so".into(),
            found: 7,
            expected: 1,
        };
        let msg = err.to_string();
        assert!(
            msg.contains("/p/libx.so") && msg.contains('7') && msg.contains("version 1"),
            "{msg}"
        );
    }

    #[test]
    fn event_view_borrows_its_fields() {
        let window = [WindowRecord {
            exact: 1,
            ..WindowRecord::default()
        }];
        let ev = EventView::new(EventKind::Result, "s", 5)
            .tool("t")
            .result("out", true, Some(2))
            .shell(true)
            .batched(true)
            .changes(true)
            .window(&window);
        let raw = &ev.raw;
        assert_eq!(raw.kind, abi::event_kind::RESULT);
        assert_eq!((raw.is_error, raw.has_exit_code, raw.exit_code), (1, 1, 2));
        assert_eq!((raw.is_shell, raw.batched, raw.changes), (1, 1, 1));
        assert_eq!(raw.result.len, 3);
        assert_eq!(raw.window_len, 1);
        assert_eq!(raw.time_ms, 5);
        let empty = EventView::new(EventKind::Call, "s", 0).window(&[]);
        assert!(empty.raw.window.is_null());
    }
}
