//! Write a loopguard detector plugin in safe Rust.
//!
//! Implement [`Detector`] for a type and invoke [`export_plugin!`] once in a `cdylib` crate: the
//! macro generates the two exported symbols of the C ABI (`loopguard-plugin-abi`), and this crate
//! supplies every `extern "C"` function behind them. Each of those runs its body under
//! [`std::panic::catch_unwind`], so a panic in your detector becomes the
//! [`PANICKED`](abi::status::PANICKED) status (the host then poisons the plugin) and never unwinds
//! into the host. Buffers handed to the host are allocated here and freed here.
//!
//! Your code never sees a raw pointer: events arrive as an [`Event`] of `&str` and slices that
//! borrow the host's data for the duration of one call, and detections leave as a [`Detection`]
//! of owned `String`s.
//!
//! # A minimal plugin
//!
//! `Cargo.toml`:
//!
//! ```toml
//! [lib]
//! crate-type = ["cdylib", "rlib"]
//!
//! [dependencies]
//! loopguard-plugin-sdk = "0.1"
//! serde_json = "1"
//! ```
//!
//! `src/lib.rs` (this is `plugins/testing/noop`, plus a detection so that there is something to
//! see):
//!
//! ```
//! use loopguard_plugin_sdk::{Detection, Detector, Event, EventKind, export_plugin};
//!
//! /// Flags a tool called more than `limit` times in a row.
//! pub struct Streak {
//!     limit: u32,
//!     last: u64,
//!     run: u32,
//! }
//!
//! impl Detector for Streak {
//!     fn name() -> &'static str {
//!         "streak"
//!     }
//!     fn version() -> &'static str {
//!         env!("CARGO_PKG_VERSION")
//!     }
//!     fn config_schema() -> serde_json::Value {
//!         serde_json::json!({
//!             "type": "object",
//!             "properties": { "limit": { "type": "integer", "minimum": 1 } },
//!             "additionalProperties": false
//!         })
//!     }
//!     fn new(config: serde_json::Value) -> Result<Self, String> {
//!         let limit = config.get("limit").and_then(|v| v.as_u64()).unwrap_or(3);
//!         let limit = u32::try_from(limit).map_err(|_| format!("`limit` {limit} is too large"))?;
//!         Ok(Streak { limit, last: 0, run: 0 })
//!     }
//!     fn on_event(&mut self, ev: &Event<'_>) -> Option<Detection> {
//!         if ev.kind != EventKind::Call {
//!             return None;
//!         }
//!         self.run = if ev.exact == self.last { self.run + 1 } else { 1 };
//!         self.last = ev.exact;
//!         (self.run > self.limit).then(|| Detection {
//!             count: self.run,
//!             key: ev.exact,
//!             message: format!("`{}` was called {} times in a row", ev.tool, self.run),
//!             pattern: format!("{} ×{}", ev.tool, self.run),
//!         })
//!     }
//! }
//!
//! export_plugin!(Streak);
//! ```
//!
//! Point a policy at the built library (`target/release/libstreak.so`) under `plugins:`.
//!
//! # Threads
//!
//! Instances must be [`Send`]: the host may call one from different threads, one call at a
//! time. [`Detector::on_event`] takes `&mut self`, so calls on one instance are always
//! serialized; [`Detector::THREAD_SAFE`] only chooses who holds the lock. Left `false` (the
//! default), the host serializes; set to `true`, the host calls without locking and this crate
//! serializes with a mutex inside the plugin.
//!
//! Either way one instance serves every session one event at a time, so one slow event holds up
//! every session. A detector whose state is per session sets [`Detector::SESSION_SHARDS`]: this
//! crate then runs that many instances, each behind its own lock, and sends each event to the
//! instance of its session, so sessions of other shards go on meanwhile.

#![warn(missing_docs)]

use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Mutex, OnceLock, PoisonError};

/// The C ABI this SDK implements (re-exported so plugins need one dependency).
pub use loopguard_plugin_abi as abi;
pub use loopguard_plugin_abi::WindowRecord;

mod sessions;
pub use sessions::Sessions;

/// A loop detector, run inside the agent host's process.
pub trait Detector: Sized + Send + 'static {
    /// The plugin's name (used in verdicts unless the policy renames it).
    fn name() -> &'static str;
    /// The plugin's version, usually `env!("CARGO_PKG_VERSION")`.
    fn version() -> &'static str;
    /// JSON Schema of the configuration [`Detector::new`] accepts. The host validates the
    /// policy's `config` against it first, so `new` sees only conforming values.
    fn config_schema() -> serde_json::Value;
    /// Builds an instance from its configuration (`null` when the policy gives none). The error
    /// is shown to the operator: say what is wrong and with which key.
    fn new(config: serde_json::Value) -> Result<Self, String>;
    /// Looks at one event. Return `Some` when a loop is detected.
    fn on_event(&mut self, ev: &Event<'_>) -> Option<Detection>;
    /// Whether the host may call without serializing (see the crate docs on threads).
    const THREAD_SAFE: bool = false;

    /// How many independent instances serve the sessions (at least 1). With more than one, the
    /// SDK builds that many (with [`Detector::new_shard`]), each behind its own lock, sends each
    /// event to the instance of its session (a stable hash of the session id,
    /// [`session_shard`]) and tells the host it may call concurrently: one session's slow event
    /// then holds up only the sessions of its shard, never all of them. For detectors whose
    /// state is per session (a [`Sessions`] map); the default, 1, is one instance for all.
    const SESSION_SHARDS: usize = 1;

    /// Builds the instance of one of `shards` shards (see [`Detector::SESSION_SHARDS`]); by
    /// default [`Detector::new`]. Override it to divide per-instance bounds (such as a number
    /// of sessions remembered) among the shards.
    fn new_shard(config: serde_json::Value, shards: usize) -> Result<Self, String> {
        let _ = shards;
        Self::new(config)
    }

    /// Whether the detector reads [`Event::arguments`]; when false the host may leave them empty
    /// and save writing them out on every call.
    const READS_ARGUMENTS: bool = true;

    /// Whether the detector does work in the background that [`Detector::wait_idle`] waits for.
    const BACKGROUND: bool = false;

    /// Blocks until background work has finished or `timeout_ms` passed (only called when
    /// [`Detector::BACKGROUND`] is true). Results should then apply at the next event.
    fn wait_idle(&mut self, _timeout_ms: u64) {}
}

/// The shard (of `shards`) whose instance serves `session` when a detector sets
/// [`Detector::SESSION_SHARDS`]: a stable FNV-1a hash of the id.
pub fn session_shard(session: &str, shards: usize) -> usize {
    (loopguard_hash::fnv1a(session.as_bytes()) % shards.max(1) as u64) as usize
}

/// What kind of event an [`Event`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// The model asked for a tool to be run.
    Call,
    /// A tool produced its output.
    Result,
    /// Assistant text with no tool call.
    Text,
    /// A message from a person.
    User,
    /// Forget everything about the session.
    Reset,
    /// A kind this SDK does not know (a newer host); ignore it.
    Other(u32),
}

impl EventKind {
    fn from_raw(kind: u32) -> EventKind {
        use abi::event_kind as k;
        match kind {
            k::CALL => EventKind::Call,
            k::RESULT => EventKind::Result,
            k::TEXT => EventKind::Text,
            k::USER => EventKind::User,
            k::RESET => EventKind::Reset,
            other => EventKind::Other(other),
        }
    }
}

/// One event, borrowed from the host for the duration of [`Detector::on_event`].
///
/// Fields that do not apply to the event's kind are empty / zero (see
/// [`abi::EventView`] for which apply to which).
#[derive(Clone, Copy, Debug)]
pub struct Event<'a> {
    /// What happened.
    pub kind: EventKind,
    /// The session (agent conversation) the event belongs to.
    pub session: &'a str,
    /// The call id of a call or result; may be empty.
    pub call_id: &'a str,
    /// The tool of a call or result.
    pub tool: &'a str,
    /// Canonical arguments (JSON text, keys sorted, volatile keys dropped).
    pub arguments: &'a str,
    /// The tool's output.
    pub result: &'a str,
    /// Assistant or user text.
    pub text: &'a str,
    /// The result is an error.
    pub is_error: bool,
    /// The exit code of a command's result, when it has one.
    pub exit_code: Option<i32>,
    /// The call's tool runs shell commands (the policy's `shell.tools`).
    pub is_shell: bool,
    /// The call (or the call a result answers) was made before the previous call's result came
    /// back: the two were decided together (one assistant message).
    pub batched: bool,
    /// The call (or the call a result answers) changes the world and is not the same change
    /// again (a write, an edit, a click on a page): its empty result is no empty answer.
    pub changes: bool,
    /// Event time in milliseconds, as the host reports it (not necessarily wall-clock time).
    pub time_ms: u64,
    /// Exact fingerprint of the call (0 if unknown).
    pub exact: u64,
    /// Fuzzy fingerprint of the call (0 if unknown).
    pub fuzzy: u64,
    /// Digest of the normalized result (0 if none).
    pub result_digest: u64,
    /// The session's recent calls, oldest first, not including this one.
    pub window: &'a [WindowRecord],
}

impl<'a> Event<'a> {
    /// An event of `kind` in `session` with every other field empty; for tests and replays.
    pub fn new(kind: EventKind, session: &'a str) -> Event<'a> {
        Event {
            kind,
            session,
            call_id: "",
            tool: "",
            arguments: "",
            result: "",
            text: "",
            is_error: false,
            exit_code: None,
            is_shell: false,
            batched: false,
            changes: false,
            time_ms: 0,
            exact: 0,
            fuzzy: 0,
            result_digest: 0,
            window: &[],
        }
    }
}

/// A detected loop.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Detection {
    /// How many times the pattern has been seen, this event included.
    pub count: u32,
    /// Identifies the loop; keep it stable across the events of one loop.
    pub key: u64,
    /// A message for the model / the operator.
    pub message: String,
    /// A short description of what repeats.
    pub pattern: String,
}

/// Exports a [`Detector`] as a loopguard plugin. Invoke once, at the root of a `cdylib` crate.
///
/// Generates `loopguard_plugin_abi_version` and `loopguard_plugin_descriptor` (public, unmangled
/// functions in the invoking module); everything else lives in this crate. Because the symbols are
/// unmangled, two plugin crates cannot be linked into one binary as rlibs: load them as `cdylib`s.
#[macro_export]
macro_rules! export_plugin {
    ($detector:ty) => {
        $crate::export_plugin!(
            @testing $detector,
            abi_version = $crate::abi::LOOPGUARD_ABI_VERSION,
            tweak = |_| {}
        );
    };
    // For loopguard's own test plugins only: lie about the ABI version, or alter the descriptor
    // (e.g. swap in a misbehaving function). Not for real plugins.
    (@testing $detector:ty, abi_version = $version:expr, tweak = $tweak:expr) => {
        /// The plugin ABI version this library was built against (generated by `export_plugin!`).
        #[unsafe(no_mangle)]
        pub extern "C" fn loopguard_plugin_abi_version() -> u32 {
            $version
        }

        /// This library's plugin descriptor (generated by `export_plugin!`).
        #[unsafe(no_mangle)]
        pub extern "C" fn loopguard_plugin_descriptor() -> *const $crate::abi::PluginDescriptor {
            static CELL: ::std::sync::OnceLock<$crate::__glue::DescriptorCell> =
                ::std::sync::OnceLock::new();
            $crate::__glue::descriptor_ptr::<$detector>(&CELL, $tweak)
        }
    };
}

/// The `extern "C"` functions behind [`export_plugin!`]. Not a stable API.
#[doc(hidden)]
pub mod __glue {
    #![allow(unsafe_code)]

    use super::*;
    use abi::{DetectionOut, EventView, OwnedBuf, PluginDescriptor, StrRef, status};

    /// A descriptor in a `static`. It holds raw pointers, hence the manual `Sync`.
    #[derive(Debug)]
    pub struct DescriptorCell(PluginDescriptor);

    // SAFETY: the descriptor points only at `'static` data that is never mutated (names from
    // `&'static str`, a leaked schema string) and at functions; sharing it between threads is
    // sharing immutable statics.
    unsafe impl Sync for DescriptorCell {}
    // SAFETY: as above; nothing in it is tied to a thread.
    unsafe impl Send for DescriptorCell {}

    /// The descriptor of `D` (passed through `tweak`, which real plugins leave alone), built on
    /// first use; null if building it panicked.
    pub fn descriptor_ptr<D: Detector>(
        cell: &OnceLock<DescriptorCell>,
        tweak: fn(&mut PluginDescriptor),
    ) -> *const PluginDescriptor {
        let build = || {
            let mut d = descriptor::<D>();
            tweak(&mut d);
            DescriptorCell(d)
        };
        catch_unwind(AssertUnwindSafe(|| &cell.get_or_init(build).0 as *const _)).unwrap_or_else(
            |payload| {
                std::mem::forget(payload);
                std::ptr::null()
            },
        )
    }

    /// The descriptor of `D`. Leaks the schema text: it must outlive the (never unloaded) library.
    pub fn descriptor<D: Detector>() -> PluginDescriptor {
        let schema: &'static str = Box::leak(D::config_schema().to_string().into_boxed_str());
        PluginDescriptor {
            struct_size: std::mem::size_of::<PluginDescriptor>(),
            abi_version: abi::LOOPGUARD_ABI_VERSION,
            flags: if D::THREAD_SAFE || D::SESSION_SHARDS > 1 {
                abi::flags::THREAD_SAFE
            } else {
                0
            } | if D::READS_ARGUMENTS {
                0
            } else {
                abi::flags::IGNORES_ARGUMENTS
            },
            name: StrRef::new(D::name()),
            version: StrRef::new(D::version()),
            config_schema: StrRef::new(schema),
            create: Some(create::<D>),
            on_event: Some(on_event::<D>),
            destroy: Some(destroy::<D>),
            free_buffer: Some(free_buffer),
            wait_idle: if D::BACKGROUND {
                Some(wait_idle::<D>)
            } else {
                None
            },
        }
    }

    /// What `create` hands out as the opaque instance pointer: one detector per session shard
    /// ([`Detector::SESSION_SHARDS`]), each behind its own lock. The host serializes calls only
    /// when the descriptor does not say THREAD_SAFE (one shard, `D::THREAD_SAFE` false); then
    /// the lock is never contended.
    struct Instance<D> {
        shards: Box<[Mutex<D>]>,
    }

    impl<D: Detector> Instance<D> {
        /// The detector serving `session`, locked.
        fn shard(&self, session: &str) -> Option<std::sync::MutexGuard<'_, D>> {
            let i = crate::session_shard(session, self.shards.len());
            self.shards
                .get(i)
                .map(|m| m.lock().unwrap_or_else(PoisonError::into_inner))
        }
    }

    /// The status for a caught panic. The payload is leaked, not dropped: its destructor could
    /// panic again, outside any `catch_unwind`.
    fn panicked(payload: Box<dyn std::any::Any + Send>) -> i32 {
        std::mem::forget(payload);
        status::PANICKED
    }

    /// Moves `text` to the heap as a buffer for the host (null when empty).
    fn to_buf(text: String) -> OwnedBuf {
        if text.is_empty() {
            return OwnedBuf::NULL;
        }
        let boxed: Box<[u8]> = text.into_bytes().into_boxed_slice();
        let len = boxed.len();
        OwnedBuf {
            ptr: Box::into_raw(boxed).cast::<u8>(),
            len,
        }
    }

    /// # Safety
    /// `r` must satisfy the [`StrRef`] contract and outlive `'a`.
    unsafe fn str_of<'a>(r: StrRef) -> &'a str {
        if r.ptr.is_null() || r.len == 0 {
            return "";
        }
        // SAFETY: the ABI guarantees `len` readable bytes of valid UTF-8 at a non-null `ptr`,
        // borrowed for the call, which is what the caller's `'a` covers. Validation is skipped on
        // purpose: it would cost O(len) per event and the host passes Rust `&str`s.
        unsafe { std::str::from_utf8_unchecked(std::slice::from_raw_parts(r.ptr, r.len)) }
    }

    /// # Safety
    /// `raw` must satisfy the [`EventView`] contract and outlive `'a`.
    unsafe fn event_of<'a>(raw: &'a EventView) -> Event<'a> {
        let window: &'a [WindowRecord] = if raw.window.is_null() || raw.window_len == 0 {
            &[]
        } else {
            // SAFETY: the ABI guarantees `window_len` initialized records at a non-null,
            // aligned `window`, borrowed for the call.
            unsafe { std::slice::from_raw_parts(raw.window, raw.window_len) }
        };
        // SAFETY: every `StrRef` in the view follows the `StrRef` contract and is borrowed for
        // the call, which `'a` covers (the `str_of` calls).
        unsafe {
            Event {
                kind: EventKind::from_raw(raw.kind),
                session: str_of(raw.session),
                call_id: str_of(raw.call_id),
                tool: str_of(raw.tool),
                arguments: str_of(raw.arguments),
                result: str_of(raw.result),
                text: str_of(raw.text),
                is_error: raw.is_error != 0,
                exit_code: (raw.has_exit_code != 0).then_some(raw.exit_code),
                is_shell: raw.is_shell != 0,
                batched: raw.batched != 0,
                changes: raw.changes != 0,
                time_ms: raw.time_ms,
                exact: raw.exact,
                fuzzy: raw.fuzzy,
                result_digest: raw.result_digest,
                window,
            }
        }
    }

    /// [`abi::CreateFn`] for `D`.
    ///
    /// # Safety
    /// The caller follows the [`abi::CreateFn`] contract.
    pub unsafe extern "C" fn create<D: Detector>(
        config_json: *const u8,
        config_len: usize,
        out_instance: *mut *mut c_void,
        out_error: *mut OwnedBuf,
    ) -> i32 {
        let body = AssertUnwindSafe(|| {
            if out_instance.is_null()
                || out_error.is_null()
                || (config_json.is_null() && config_len != 0)
            {
                return status::INVALID_ARGUMENT;
            }
            let config = if config_len == 0 {
                serde_json::Value::Null
            } else {
                // SAFETY: the ABI guarantees `config_len` readable bytes at non-null
                // `config_json` for the duration of this call (checked non-null above).
                let bytes = unsafe { std::slice::from_raw_parts(config_json, config_len) };
                match serde_json::from_slice(bytes) {
                    Ok(v) => v,
                    Err(e) => {
                        // SAFETY: `out_error` is non-null (checked above) and writable per the ABI.
                        unsafe { *out_error = to_buf(format!("configuration is not JSON: {e}")) };
                        return status::ERROR;
                    }
                }
            };
            let count = D::SESSION_SHARDS.max(1);
            let built: Result<Vec<Mutex<D>>, String> = (0..count)
                .map(|_| D::new_shard(config.clone(), count).map(Mutex::new))
                .collect();
            match built {
                Ok(shards) => {
                    let instance = Box::new(Instance {
                        shards: shards.into_boxed_slice(),
                    });
                    // SAFETY: `out_instance` is non-null (checked above) and writable per the ABI.
                    unsafe { *out_instance = Box::into_raw(instance).cast::<c_void>() };
                    status::OK
                }
                Err(message) => {
                    // SAFETY: `out_error` is non-null (checked above) and writable per the ABI.
                    unsafe { *out_error = to_buf(message) };
                    status::ERROR
                }
            }
        });
        catch_unwind(body).unwrap_or_else(panicked)
    }

    /// [`abi::OnEventFn`] for `D`.
    ///
    /// # Safety
    /// The caller follows the [`abi::OnEventFn`] contract; `instance` came from `create::<D>`.
    pub unsafe extern "C" fn on_event<D: Detector>(
        instance: *mut c_void,
        event: *const EventView,
        out: *mut DetectionOut,
    ) -> i32 {
        let body = AssertUnwindSafe(|| {
            if instance.is_null() || event.is_null() || out.is_null() {
                return status::INVALID_ARGUMENT;
            }
            // SAFETY: `event` is non-null and, per the ABI, a valid view borrowed for this call.
            let raw = unsafe { &*event };
            if raw.struct_size < std::mem::size_of::<EventView>() {
                return status::INVALID_ARGUMENT;
            }
            // SAFETY: the view follows the ABI contract and lives for this call, as does `ev`.
            let ev = unsafe { event_of(raw) };
            // SAFETY: `instance` was produced by `create::<D>` (a `Box<Instance<D>>`) and not yet
            // destroyed; the host only hands us its own instances.
            let instance = unsafe { &*instance.cast::<Instance<D>>() };
            let Some(mut detector) = instance.shard(ev.session) else {
                return status::ERROR;
            };
            match detector.on_event(&ev) {
                None => status::NO_DETECTION,
                Some(d) => {
                    let filled = DetectionOut {
                        detected: 1,
                        count: d.count,
                        key: d.key,
                        message: to_buf(d.message),
                        pattern: to_buf(d.pattern),
                    };
                    // SAFETY: `out` is non-null (checked above) and writable per the ABI.
                    unsafe { *out = filled };
                    status::OK
                }
            }
        });
        catch_unwind(body).unwrap_or_else(panicked)
    }

    /// [`abi::WaitIdleFn`] for `D`.
    ///
    /// # Safety
    /// The caller follows the [`abi::WaitIdleFn`] contract; `instance` came from `create::<D>`.
    pub unsafe extern "C" fn wait_idle<D: Detector>(instance: *mut c_void, timeout_ms: u64) -> i32 {
        let body = AssertUnwindSafe(|| {
            if instance.is_null() {
                return status::INVALID_ARGUMENT;
            }
            // SAFETY: `instance` was produced by `create::<D>` and not yet destroyed.
            let instance = unsafe { &*instance.cast::<Instance<D>>() };
            for shard in &instance.shards {
                shard
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .wait_idle(timeout_ms);
            }
            status::OK
        });
        catch_unwind(body).unwrap_or_else(panicked)
    }

    /// [`abi::DestroyFn`] for `D`.
    ///
    /// # Safety
    /// `instance` came from `create::<D>` and is destroyed at most once.
    pub unsafe extern "C" fn destroy<D: Detector>(instance: *mut c_void) {
        if instance.is_null() {
            return;
        }
        // A panicking `Drop` is swallowed (and its payload leaked): there is nobody to report
        // it to.
        let result = catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: `instance` is the `Box<Instance<D>>` leaked by `create::<D>`, freed once.
            drop(unsafe { Box::from_raw(instance.cast::<Instance<D>>()) });
        }));
        if let Err(payload) = result {
            std::mem::forget(payload);
        }
    }

    /// [`abi::FreeBufferFn`]: frees a buffer made by `to_buf`.
    ///
    /// # Safety
    /// `(ptr, len)` is a buffer this library handed out and has not been freed yet, or `ptr` is
    /// null.
    pub unsafe extern "C" fn free_buffer(ptr: *mut u8, len: usize) {
        if ptr.is_null() {
            return;
        }
        // SAFETY: `(ptr, len)` is the `Box<[u8]>` leaked by `to_buf` in this library (same
        // allocator), returned exactly once per the ABI.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, len)) });
    }
}

#[cfg(test)]
mod tests {
    #![allow(unsafe_code)]

    use super::*;
    use abi::{DetectionOut, EventView, OwnedBuf, StrRef, status};

    struct Echo {
        fail_on: String,
    }

    impl Detector for Echo {
        fn name() -> &'static str {
            "echo"
        }
        fn version() -> &'static str {
            "1.2.3"
        }
        fn config_schema() -> serde_json::Value {
            serde_json::json!({"type": "object"})
        }
        fn new(config: serde_json::Value) -> Result<Self, String> {
            if config.get("reject").is_some() {
                return Err("rejected: `reject` is set".into());
            }
            Ok(Echo {
                fail_on: config["panic_on"].as_str().unwrap_or("").to_string(),
            })
        }
        fn on_event(&mut self, ev: &Event<'_>) -> Option<Detection> {
            if !self.fail_on.is_empty() && ev.tool == self.fail_on {
                panic!("asked to panic");
            }
            (ev.kind == EventKind::Call && ev.tool == "hit").then(|| Detection {
                count: ev.window.len() as u32 + 1,
                key: ev.exact,
                message: format!("{} in {}", ev.tool, ev.session),
                pattern: String::new(),
            })
        }
    }

    fn create(config: &str) -> (i32, *mut c_void, String) {
        let mut instance = std::ptr::null_mut();
        let mut err = OwnedBuf::NULL;
        // SAFETY: test code calling the glue as the host would: valid, live pointers.
        let rc = unsafe {
            __glue::create::<Echo>(config.as_ptr(), config.len(), &mut instance, &mut err)
        };
        let msg = take(err);
        (rc, instance, msg)
    }

    fn take(buf: OwnedBuf) -> String {
        if buf.ptr.is_null() {
            return String::new();
        }
        // SAFETY: test code calling the glue as the host would: valid, live pointers.
        let s = String::from_utf8(unsafe { std::slice::from_raw_parts(buf.ptr, buf.len) }.to_vec())
            .unwrap();
        // SAFETY: test code calling the glue as the host would: valid, live pointers.
        unsafe { __glue::free_buffer(buf.ptr, buf.len) };
        s
    }

    fn call(instance: *mut c_void, tool: &str, window: &[WindowRecord]) -> (i32, DetectionOut) {
        let mut ev = EventView::empty(abi::event_kind::CALL);
        ev.session = StrRef::new("s1");
        ev.tool = StrRef::new(tool);
        ev.exact = 42;
        ev.window = window.as_ptr();
        ev.window_len = window.len();
        let mut out = DetectionOut::EMPTY;
        // SAFETY: test code calling the glue as the host would: valid, live pointers.
        let rc = unsafe { __glue::on_event::<Echo>(instance, &ev, &mut out) };
        (rc, out)
    }

    #[test]
    fn descriptor_describes_the_detector() {
        let d = __glue::descriptor::<Echo>();
        assert_eq!(d.struct_size, std::mem::size_of::<abi::PluginDescriptor>());
        assert_eq!(d.abi_version, abi::LOOPGUARD_ABI_VERSION);
        assert_eq!(d.flags & abi::flags::THREAD_SAFE, 0);
        // SAFETY: test code calling the glue as the host would: valid, live pointers.
        let name = unsafe { std::slice::from_raw_parts(d.name.ptr, d.name.len) };
        assert_eq!(name, b"echo");
        // SAFETY: test code calling the glue as the host would: valid, live pointers.
        let schema =
            unsafe { std::slice::from_raw_parts(d.config_schema.ptr, d.config_schema.len) };
        let schema: serde_json::Value = serde_json::from_slice(schema).unwrap();
        assert_eq!(schema, serde_json::json!({"type": "object"}));
    }

    #[test]
    fn detection_round_trips_through_the_abi() {
        let (rc, instance, _) = create("{}");
        assert_eq!(rc, status::OK);
        let window = [WindowRecord::default(); 2];
        let (rc, out) = call(instance, "hit", &window);
        assert_eq!(rc, status::OK);
        assert_eq!(out.detected, 1);
        assert_eq!(out.count, 3);
        assert_eq!(out.key, 42);
        assert_eq!(take(out.message), "hit in s1");
        assert!(out.pattern.ptr.is_null(), "empty text is no buffer");
        let (rc, out) = call(instance, "miss", &[]);
        assert_eq!(rc, status::NO_DETECTION);
        assert_eq!(out.detected, 0);
        // SAFETY: test code calling the glue as the host would: valid, live pointers.
        unsafe { __glue::destroy::<Echo>(instance) };
    }

    #[test]
    fn create_reports_the_detectors_error() {
        let (rc, instance, msg) = create(r#"{"reject": true}"#);
        assert_eq!(rc, status::ERROR);
        assert!(instance.is_null());
        assert_eq!(msg, "rejected: `reject` is set");
        let (rc, _, msg) = create("{not json");
        assert_eq!(rc, status::ERROR);
        assert!(msg.starts_with("configuration is not JSON"), "{msg}");
    }

    #[test]
    fn empty_config_is_null() {
        let (rc, instance, _) = create("");
        assert_eq!(rc, status::OK);
        // SAFETY: test code calling the glue as the host would: valid, live pointers.
        unsafe { __glue::destroy::<Echo>(instance) };
    }

    #[test]
    fn panic_becomes_a_status_not_an_unwind() {
        let (rc, instance, _) = create(r#"{"panic_on": "boom"}"#);
        assert_eq!(rc, status::OK);
        let (rc, out) = call(instance, "boom", &[]);
        assert_eq!(rc, status::PANICKED);
        assert!(out.message.ptr.is_null());
    }

    #[test]
    fn null_arguments_are_refused() {
        let mut out = DetectionOut::EMPTY;
        // SAFETY: test code calling the glue as the host would: valid, live pointers.
        let rc =
            unsafe { __glue::on_event::<Echo>(std::ptr::null_mut(), std::ptr::null(), &mut out) };
        assert_eq!(rc, status::INVALID_ARGUMENT);
        // SAFETY: test code calling the glue as the host would: valid, live pointers.
        unsafe { __glue::free_buffer(std::ptr::null_mut(), 0) };
    }

    #[test]
    fn unknown_kinds_are_kept() {
        assert_eq!(EventKind::from_raw(99), EventKind::Other(99));
        assert_eq!(
            EventKind::from_raw(abi::event_kind::RESET),
            EventKind::Reset
        );
    }
}
