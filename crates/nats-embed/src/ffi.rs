//! The C functions exported by the Go shim (`go/shim.go`), wrapped so that the rest of the
//! crate never touches a raw pointer.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString, c_char, c_int};

unsafe extern "C" {
    fn KineNatsStart(request: *const c_char) -> *mut c_char;
    fn KineNatsWaitReady(timeout_ms: c_int) -> *mut c_char;
    fn KineNatsInfo() -> *mut c_char;
    fn KineNatsNextLog(timeout_ms: c_int) -> *mut c_char;
    fn KineNatsShutdown();
    fn KineNatsFree(p: *mut c_char);
}

/// Copies a string the shim allocated and frees it; NULL is `None`.
fn take(p: *mut c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: a non-NULL result of the shim is a NUL-terminated C.CString that we own and
    // free exactly once, here.
    let s = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
    unsafe { KineNatsFree(p) };
    Some(s)
}

fn clamp_ms(ms: u128) -> c_int {
    ms.min(c_int::MAX as u128) as c_int
}

/// Starts the server (non-blocking); `Some(error)` when it cannot be created.
pub fn start(request_json: &str) -> Option<String> {
    let request = CString::new(request_json).ok()?;
    // SAFETY: `request` is a valid C string that outlives the call; Go copies it.
    take(unsafe { KineNatsStart(request.as_ptr()) })
}

/// NULL = ready, `wait:<reason>`, or `fail:<reason>`.
pub fn wait_ready(timeout: std::time::Duration) -> Option<String> {
    // SAFETY: plain call; the result is handled by `take`.
    take(unsafe { KineNatsWaitReady(clamp_ms(timeout.as_millis())) })
}

pub fn info() -> Option<String> {
    // SAFETY: plain call; the result is handled by `take`.
    take(unsafe { KineNatsInfo() })
}

/// The next log line, `None` after `timeout`, `Some("")` once the server is gone.
pub fn next_log(timeout: std::time::Duration) -> Option<String> {
    // SAFETY: plain call; the result is handled by `take`.
    take(unsafe { KineNatsNextLog(clamp_ms(timeout.as_millis())) })
}

/// Stops the server and waits for it; idempotent.
pub fn shutdown() {
    // SAFETY: plain call into Go; the shim serialises concurrent calls.
    unsafe { KineNatsShutdown() }
}
