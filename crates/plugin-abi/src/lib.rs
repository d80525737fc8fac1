//! The C ABI between loopguard and its detector plugins.
//!
//! A plugin is a shared library (`cdylib`) exporting two `extern "C"` functions:
//!
//! 1. [`ABI_VERSION_SYMBOL`] (`loopguard_plugin_abi_version`, an [`AbiVersionFn`]) returns the
//!    [`LOOPGUARD_ABI_VERSION`] the plugin was built against. The host calls it **before anything
//!    else** and refuses a library whose version differs from its own.
//! 2. [`DESCRIPTOR_SYMBOL`] (`loopguard_plugin_descriptor`, a [`DescriptorFn`]) returns a pointer
//!    to a [`PluginDescriptor`]: the plugin's name, version, the JSON Schema of its configuration,
//!    its flags and its function pointers.
//!
//! Everything that crosses the boundary is `#[repr(C)]`: plain integers, `(pointer, length)` pairs
//! of UTF-8 text, and function pointers. No Rust type (no `String`, no `Vec`, no trait object)
//! crosses it, and neither does an unwinding panic.
//!
//! # Ownership, in one paragraph
//!
//! What the host passes in ([`EventView`], the configuration text) is **borrowed** for the duration
//! of one call: the plugin must copy whatever it wants to keep. What the plugin passes out
//! ([`OwnedBuf`] in [`DetectionOut`] and the `create` error) is **allocated by the plugin** and
//! handed to the host, which copies it and gives it back through the plugin's own
//! [`PluginDescriptor::free_buffer`]; allocators never mix. What the descriptor points at (name,
//! version, schema, the descriptor itself) is **static**: libraries are never unloaded.
//!
//! # Evolution
//!
//! [`PluginDescriptor`] and [`EventView`] start with their own size (`struct_size`) and only grow
//! by appending fields, so a reader can tell which fields the writer knew about. Any other change
//! (a field's type or meaning, a removed field, a new meaning for a status code) bumps
//! [`LOOPGUARD_ABI_VERSION`].
//!
//! This crate has no dependencies and contains no code beyond constants and type definitions;
//! write plugins in Rust with `loopguard-plugin-sdk`, which generates every export safely.
//!
//! # Example
//!
//! Reading an event the way a plugin does: check `kind`, then read only the fields that kind
//! sets, and only those that `struct_size` says the writer filled.
//!
//! ```
//! use core::mem::{offset_of, size_of};
//! use loopguard_plugin_abi::{EventView, StrRef, event_kind};
//!
//! let mut ev = EventView::empty(event_kind::CALL);
//! ev.tool = StrRef::new("search");
//! ev.exact = 0x1234;
//!
//! assert_eq!(ev.kind, event_kind::CALL);
//! assert_eq!(ev.tool.len, "search".len());
//! assert_eq!(ev.exact, 0x1234);
//! // `window_len` is the last field: a view this large has every field this crate knows.
//! let knows_window = ev.struct_size >= offset_of!(EventView, window_len) + size_of::<usize>();
//! assert!(knows_window);
//! assert_eq!(ev.window_len, 0);
//! ```

#![warn(missing_docs)]
#![cfg_attr(not(test), no_std)]

use core::ffi::{CStr, c_void};

/// The version of this ABI. A host loads only plugins that report exactly this value.
pub const LOOPGUARD_ABI_VERSION: u32 = 1;

/// The symbol the host reads first: an [`AbiVersionFn`].
pub const ABI_VERSION_SYMBOL: &CStr = c"loopguard_plugin_abi_version";

/// The symbol the host reads second, once the version matched: a [`DescriptorFn`].
pub const DESCRIPTOR_SYMBOL: &CStr = c"loopguard_plugin_descriptor";

/// `loopguard_plugin_abi_version`: returns the [`LOOPGUARD_ABI_VERSION`] the plugin was built
/// against. Must not fail, allocate or unwind.
pub type AbiVersionFn = unsafe extern "C" fn() -> u32;

/// `loopguard_plugin_descriptor`: returns a pointer to the plugin's descriptor, or null if the
/// plugin cannot describe itself (the host refuses it). The pointee must stay valid and unchanged
/// for the life of the process (a `static`). The host may call this more than once.
pub type DescriptorFn = unsafe extern "C" fn() -> *const PluginDescriptor;

/// Status codes returned by [`CreateFn`] and [`OnEventFn`].
///
/// Plain `i32` constants, not an enum: a value this ABI does not define must not be undefined
/// behaviour on either side. The host treats any value not listed here as an error.
pub mod status {
    /// Success. For `on_event`: the [`DetectionOut`](crate::DetectionOut) was written; its
    /// `detected` field says whether something was detected.
    pub const OK: i32 = 0;
    /// `on_event` only: nothing detected, and the `DetectionOut` was left untouched.
    pub const NO_DETECTION: i32 = 1;
    /// The call failed (bad configuration, invalid argument, internal error). For `create`, the
    /// error buffer may hold a message.
    pub const ERROR: i32 = 2;
    /// The plugin panicked and caught the panic at the boundary. The host must consider the
    /// instance poisoned: it calls none of its functions again (not even `destroy`, nor
    /// `free_buffer` for that call's buffers).
    pub const PANICKED: i32 = 3;
    /// A pointer argument that must not be null was null, or a view was smaller than required.
    pub const INVALID_ARGUMENT: i32 = 4;
}

/// Bits of [`PluginDescriptor::flags`].
pub mod flags {
    /// `on_event` may be called concurrently on the same instance from several threads: the
    /// plugin synchronizes itself. Without this bit the host serializes calls per instance (it
    /// may still make them from different threads, one at a time, so instances must be `Send`).
    pub const THREAD_SAFE: u32 = 1 << 0;
    /// The plugin never reads [`EventView`](super::EventView)'s `arguments`: the host may leave them empty and skip
    /// writing them out.
    pub const IGNORES_ARGUMENTS: u32 = 1 << 1;
}

/// [`EventView::kind`] values. Zero is never a valid kind; a plugin should ignore kinds it does
/// not know (the host may add kinds within the same ABI version).
pub mod event_kind {
    /// The model asked for a tool to be run. `tool`, `call_id`, `arguments`, `exact` and `fuzzy`
    /// are set.
    pub const CALL: u32 = 1;
    /// A tool produced its output. `result`, `is_error`, `exit_code`, `result_digest` are set;
    /// `tool`, `arguments`, `exact` and `fuzzy` describe the call it answers when the host knows
    /// it (else empty / zero).
    pub const RESULT: u32 = 2;
    /// Assistant text with no tool call. `text` is set.
    pub const TEXT: u32 = 3;
    /// A message from a person. `text` is set.
    pub const USER: u32 = 4;
    /// Forget everything about the session.
    pub const RESET: u32 = 5;
}

/// Bits of [`WindowRecord::flags`].
pub mod window_flags {
    /// The call has a result and `result_digest` is meaningful.
    pub const HAS_RESULT: u32 = 1 << 0;
    /// The result was an error.
    pub const IS_ERROR: u32 = 1 << 1;
}

/// Borrowed UTF-8 text: `len` bytes at `ptr`.
///
/// Always valid UTF-8 (the writer guarantees it; readers may rely on it). `ptr` may be null only
/// when `len` is 0. Who owns the bytes and for how long is stated where the `StrRef` appears.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct StrRef {
    /// The first byte; null only when `len` is 0.
    pub ptr: *const u8,
    /// The length in bytes.
    pub len: usize,
}

impl StrRef {
    /// The empty string (null pointer, zero length).
    pub const EMPTY: StrRef = StrRef {
        ptr: core::ptr::null(),
        len: 0,
    };

    /// A view of `s`. The view does not keep `s` alive: the caller keeps it valid as long as the
    /// view is used.
    pub const fn new(s: &str) -> StrRef {
        StrRef {
            ptr: s.as_ptr(),
            len: s.len(),
        }
    }
}

/// A buffer allocated by the **plugin** and handed to the host: `len` bytes of UTF-8 at `ptr`.
///
/// The host copies the bytes and then returns the buffer, exactly once, to the plugin's
/// [`PluginDescriptor::free_buffer`] with the same `ptr` and `len`. A null `ptr` means "no buffer"
/// (nothing to free).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct OwnedBuf {
    /// The first byte, allocated by the plugin; null for no buffer.
    pub ptr: *mut u8,
    /// The length in bytes.
    pub len: usize,
}

impl OwnedBuf {
    /// No buffer.
    pub const NULL: OwnedBuf = OwnedBuf {
        ptr: core::ptr::null_mut(),
        len: 0,
    };
}

/// `create(config_json, config_len, out_instance, out_error) -> status`.
///
/// - `config_json`/`config_len`: the plugin's configuration as JSON text, already validated by
///   the host against [`PluginDescriptor::config_schema`]. Borrowed for this call only. Empty
///   (`len` 0) means no configuration (`null`).
/// - `out_instance`: never null. On [`status::OK`] the plugin writes its opaque instance pointer
///   there (it may be null for a stateless plugin); the host passes it to `on_event` and
///   `destroy`, and never dereferences it.
/// - `out_error`: never null; the host initializes it to [`OwnedBuf::NULL`]. On failure the plugin
///   may write a message there (UTF-8, plugin-allocated, freed by the host via `free_buffer`).
///
/// Returns [`status::OK`], [`status::ERROR`] or [`status::PANICKED`]. Called once per
/// configured plugin, not per event.
pub type CreateFn = unsafe extern "C" fn(
    config_json: *const u8,
    config_len: usize,
    out_instance: *mut *mut c_void,
    out_error: *mut OwnedBuf,
) -> i32;

/// `on_event(instance, event, out) -> status`.
///
/// - `instance`: what `create` returned.
/// - `event`: never null; borrowed for this call only (every pointer inside it too).
/// - `out`: never null; the host zero-initializes it ([`DetectionOut::EMPTY`]). On [`status::OK`]
///   the plugin has written it; its buffers then belong to the host until it returns them through
///   `free_buffer`. On any other status the plugin should leave the buffers null; the host still
///   returns non-null ones through `free_buffer`, except after [`status::PANICKED`].
///
/// Without [`flags::THREAD_SAFE`] the host never calls this concurrently on one instance.
pub type OnEventFn = unsafe extern "C" fn(
    instance: *mut c_void,
    event: *const EventView,
    out: *mut DetectionOut,
) -> i32;

/// `destroy(instance)`: frees an instance. Called at most once; never after the instance
/// panicked. Must not unwind.
pub type DestroyFn = unsafe extern "C" fn(instance: *mut c_void);

/// `free_buffer(ptr, len)`: frees a buffer this plugin allocated ([`OwnedBuf`]), with the `ptr`
/// and `len` it was handed out with. Must accept a null `ptr` (and do nothing). Must not unwind.
pub type FreeBufferFn = unsafe extern "C" fn(ptr: *mut u8, len: usize);

/// `wait_idle(instance, timeout_ms) -> status`: blocks until work the plugin started in the
/// background (e.g. a request to a model) has finished, or `timeout_ms` passed; results then apply
/// at the plugin's next event. Replays (`loopctl simulate`) call it after every event so they are
/// deterministic. Serialized like [`OnEventFn`]. Returns [`status::OK`] or [`status::PANICKED`].
pub type WaitIdleFn = unsafe extern "C" fn(instance: *mut c_void, timeout_ms: u64) -> i32;

/// What a plugin is and how to call it. Returned by [`DescriptorFn`].
///
/// **Static**: the descriptor and everything it points at must stay valid and unchanged for the
/// life of the process. The host copies the fields it needs.
///
/// **Append-only**: new fields go at the end. The host reads `struct_size` first and refuses a
/// descriptor smaller than the fields it needs.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PluginDescriptor {
    /// `size_of::<PluginDescriptor>()` as the plugin knew it. Always the first field.
    pub struct_size: usize,
    /// [`LOOPGUARD_ABI_VERSION`] again; must equal what [`AbiVersionFn`] returned.
    pub abi_version: u32,
    /// Bits from [`flags`]; unknown bits are ignored.
    pub flags: u32,
    /// The plugin's name (static UTF-8), used in verdicts unless the policy renames it.
    pub name: StrRef,
    /// The plugin's version (static UTF-8), e.g. `0.1.0`.
    pub version: StrRef,
    /// JSON Schema (static UTF-8 JSON text) of the configuration `create` accepts. The host
    /// validates the policy's `config` against it before calling `create`.
    pub config_schema: StrRef,
    /// See [`CreateFn`]. Null makes the host refuse the plugin (as do the three below).
    pub create: Option<CreateFn>,
    /// See [`OnEventFn`].
    pub on_event: Option<OnEventFn>,
    /// See [`DestroyFn`].
    pub destroy: Option<DestroyFn>,
    /// See [`FreeBufferFn`].
    pub free_buffer: Option<FreeBufferFn>,
    /// See [`WaitIdleFn`]; null when the plugin does no background work. Appended after the
    /// first version: a descriptor whose `struct_size` ends before it has none.
    pub wait_idle: Option<WaitIdleFn>,
}

/// The size of the first version of [`PluginDescriptor`] (through `free_buffer`): the smallest
/// descriptor a host accepts. Fields after it are optional and read as null when absent.
pub const PLUGIN_DESCRIPTOR_MIN_SIZE: usize = core::mem::offset_of!(PluginDescriptor, free_buffer)
    + core::mem::size_of::<Option<FreeBufferFn>>();

/// One past call in the session's recent window, oldest first, as fingerprints only.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WindowRecord {
    /// Exact fingerprint of the call (tool + canonical arguments).
    pub exact: u64,
    /// Fuzzy fingerprint of the call (tool + primary arguments, shell-normalized).
    pub fuzzy: u64,
    /// Digest of the normalized result; meaningful only with [`window_flags::HAS_RESULT`].
    pub result_digest: u64,
    /// Bits from [`window_flags`].
    pub flags: u32,
    /// Always 0 (explicit padding, so the layout has no uninitialized bytes).
    pub reserved: u32,
}

/// A borrowed view of one event.
///
/// **Borrowed for one call**: every pointer in it (and the view itself) is valid only until the
/// `on_event` call it was passed to returns. Text fields are valid UTF-8 (see [`StrRef`]); fields
/// that do not apply to the event's `kind` are empty / zero.
///
/// **Append-only**: new fields go at the end; `struct_size` says how many the host filled.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct EventView {
    /// `size_of::<EventView>()` as the host knew it. Always the first field.
    pub struct_size: usize,
    /// One of [`event_kind`].
    pub kind: u32,
    /// The tool's exit code; meaningful only when `has_exit_code` is 1.
    pub exit_code: i32,
    /// 1 if the result was an error (RESULT events), else 0.
    pub is_error: u8,
    /// 1 if `exit_code` is meaningful (RESULT events of tools that have one), else 0.
    pub has_exit_code: u8,
    /// 1 if the call's tool runs shell commands (the policy's `shell.tools`; CALL and RESULT),
    /// else 0. A shell command printing nothing succeeded quietly: it found no empty answer.
    /// Hosts older than this field leave it 0.
    pub is_shell: u8,
    /// 1 if the call (or the call a RESULT answers) was made before the previous call's result
    /// came back: both were decided together, in one assistant message, before the model saw
    /// either outcome (CALL and RESULT), else 0. Hosts older than this field leave it 0.
    pub batched: u8,
    /// 1 if the call (or the call a RESULT answers) changes the world and is not the same change
    /// again (a write, an edit, a click on a page: a tool of a category with `modifies`, or a
    /// modifying shell command), else 0. Such a call that reports nothing succeeded: its empty
    /// result is no empty answer. Hosts older than this field leave it 0.
    pub changes: u8,
    /// Always 0 (explicit padding, so the layout has no uninitialized bytes on 64-bit targets).
    pub reserved: [u8; 3],
    /// Event time in milliseconds, supplied by the agent host (monotonic within a session).
    pub time_ms: u64,
    /// The session the event belongs to.
    pub session: StrRef,
    /// The host's id of the call (CALL, and RESULT when known).
    pub call_id: StrRef,
    /// The tool's name (CALL, and RESULT when known).
    pub tool: StrRef,
    /// The call's canonical arguments as JSON text: keys sorted, volatile keys dropped; raw text
    /// when the model's arguments were not JSON.
    pub arguments: StrRef,
    /// The tool's output (RESULT).
    pub result: StrRef,
    /// Assistant or user text (TEXT, USER).
    pub text: StrRef,
    /// Exact fingerprint of the call (or of the call a RESULT answers); 0 if unknown.
    pub exact: u64,
    /// Fuzzy fingerprint of the call (or of the call a RESULT answers); 0 if unknown.
    pub fuzzy: u64,
    /// Digest of the normalized result (RESULT); 0 otherwise.
    pub result_digest: u64,
    /// The session's recent window of calls, oldest first, **not** including this event:
    /// `window_len` records at `window` (null when `window_len` is 0).
    pub window: *const WindowRecord,
    /// Number of records at `window`.
    pub window_len: usize,
}

impl EventView {
    /// An event of `kind` with every other field empty / zero and `struct_size` set.
    pub const fn empty(kind: u32) -> EventView {
        EventView {
            struct_size: core::mem::size_of::<EventView>(),
            kind,
            exit_code: 0,
            is_error: 0,
            has_exit_code: 0,
            is_shell: 0,
            batched: 0,
            changes: 0,
            reserved: [0; 3],
            time_ms: 0,
            session: StrRef::EMPTY,
            call_id: StrRef::EMPTY,
            tool: StrRef::EMPTY,
            arguments: StrRef::EMPTY,
            result: StrRef::EMPTY,
            text: StrRef::EMPTY,
            exact: 0,
            fuzzy: 0,
            result_digest: 0,
            window: core::ptr::null(),
            window_len: 0,
        }
    }
}

/// What `on_event` reports. The host zero-initializes it ([`DetectionOut::EMPTY`]); the plugin
/// fills it and returns [`status::OK`], or leaves it and returns [`status::NO_DETECTION`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DetectionOut {
    /// 1 if the plugin detected a loop, 0 if not.
    pub detected: u32,
    /// How many times the looping pattern has been seen (including this event).
    pub count: u32,
    /// Identifies the loop: stable across the events of one loop, so the host can escalate per
    /// loop. Chosen by the plugin.
    pub key: u64,
    /// A message for the model / the operator (UTF-8, plugin-allocated, see [`OwnedBuf`]).
    pub message: OwnedBuf,
    /// A short description of the pattern, e.g. the tool and what repeats (UTF-8,
    /// plugin-allocated, see [`OwnedBuf`]).
    pub pattern: OwnedBuf,
}

impl DetectionOut {
    /// Nothing detected, no buffers.
    pub const EMPTY: DetectionOut = DetectionOut {
        detected: 0,
        count: 0,
        key: 0,
        message: OwnedBuf::NULL,
        pattern: OwnedBuf::NULL,
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{align_of, offset_of, size_of};

    #[test]
    fn size_is_the_first_field() {
        assert_eq!(offset_of!(PluginDescriptor, struct_size), 0);
        assert_eq!(offset_of!(EventView, struct_size), 0);
    }

    #[test]
    #[cfg(target_pointer_width = "64")]
    fn event_view_has_no_implicit_padding() {
        assert_eq!(offset_of!(EventView, time_ms), 24);
        assert_eq!(offset_of!(EventView, session), 32);
        assert_eq!(size_of::<EventView>(), 32 + 6 * 16 + 3 * 8 + 16);
        assert_eq!(size_of::<DetectionOut>(), 16 + 2 * 16);
        assert_eq!(size_of::<PluginDescriptor>(), 16 + 3 * 16 + 5 * 8);
        assert_eq!(PLUGIN_DESCRIPTOR_MIN_SIZE, 16 + 3 * 16 + 4 * 8);
    }

    #[test]
    fn window_record_has_no_implicit_padding() {
        assert_eq!(size_of::<WindowRecord>(), 32);
        assert_eq!(align_of::<WindowRecord>(), 8);
    }

    #[test]
    fn symbols_are_nul_terminated_names() {
        assert_eq!(
            ABI_VERSION_SYMBOL.to_bytes(),
            b"loopguard_plugin_abi_version"
        );
        assert_eq!(DESCRIPTOR_SYMBOL.to_bytes(), b"loopguard_plugin_descriptor");
    }

    #[test]
    fn status_codes_are_distinct() {
        let all = [
            status::OK,
            status::NO_DETECTION,
            status::ERROR,
            status::PANICKED,
            status::INVALID_ARGUMENT,
        ];
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }

    #[test]
    fn empty_event_knows_its_size() {
        let ev = EventView::empty(event_kind::CALL);
        assert_eq!(ev.struct_size, size_of::<EventView>());
        assert_eq!(ev.window_len, 0);
    }

    #[test]
    fn str_ref_points_at_its_text() {
        let s = "abc";
        let r = StrRef::new(s);
        assert_eq!(r.len, 3);
        assert_eq!(r.ptr, s.as_ptr());
    }
}
