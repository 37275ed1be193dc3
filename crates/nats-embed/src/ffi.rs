//! The C functions exported by the Go shim (`go/shim.go`), wrapped so that the rest of the
//! crate never touches a raw pointer.
//!
//! The shim is a Go shared library (`build.rs`) kept inside the kine-rs binary and loaded on
//! first use: copied into an anonymous memory file and opened with `dlopen`. A process that
//! never starts the embedded server never starts the Go runtime either (no Go threads, and
//! none of the ~12 MB that the runtime and nats-server's package initialisers touch at load).
#![allow(unsafe_code)]

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::fs::File;
use std::io::Write;
use std::os::fd::FromRawFd;
use std::sync::OnceLock;
use std::time::Duration;

/// The shim as `go build -buildmode=c-shared` wrote it.
static LIBRARY: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libkinenats.so"));

type StrFn = unsafe extern "C" fn() -> *mut c_char;
type StrArgFn = unsafe extern "C" fn(*const c_char) -> *mut c_char;
type TimeoutFn = unsafe extern "C" fn(c_int) -> *mut c_char;
type LastSeqFn = unsafe extern "C" fn(*const c_char, *const c_char, *mut u64, *mut i64) -> i64;

pub(crate) struct Shim {
    start: StrArgFn,
    wait_ready: TimeoutFn,
    info: StrFn,
    next_log: TimeoutFn,
    shutdown: unsafe extern "C" fn(),
    account_of: unsafe extern "C" fn(*const c_char, u64) -> *mut c_char,
    stream_last_seq: LastSeqFn,
    free: unsafe extern "C" fn(*mut c_char),
    pub(crate) bolt: crate::bolt_fns::Fns,
}

static SHIM: OnceLock<Result<Shim, String>> = OnceLock::new();

/// The loaded shim, loading it on the first call.
pub(crate) fn shim() -> Result<&'static Shim, String> {
    SHIM.get_or_init(load).as_ref().map_err(Clone::clone)
}

/// The shim if it was loaded: the functions that only make sense after `start` never load it.
fn loaded() -> Option<&'static Shim> {
    SHIM.get().and_then(|s| s.as_ref().ok())
}

fn load() -> Result<Shim, String> {
    let started = std::time::Instant::now();
    let fail = |what: &str, e: String| format!("cannot load the embedded nats-server: {what}: {e}");
    // SAFETY: a valid C string; the returned descriptor is owned by `file` from here on.
    let fd = unsafe { libc::memfd_create(c"kine-rs-nats-server".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(fail("memfd_create", std::io::Error::last_os_error().to_string()));
    }
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    let mut file = unsafe { File::from_raw_fd(fd) };
    file.write_all(LIBRARY).map_err(|e| fail("write the library", e.to_string()))?;
    forget_copied_pages();
    let copied = started.elapsed();
    let path = CString::new(format!("/proc/self/fd/{fd}")).map_err(|e| fail("path", e.to_string()))?;
    // SAFETY: `path` names the complete library just written; its initialisers start the Go
    // runtime, which is what loading it is for. The mapping keeps the file alive once `file`
    // is closed.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    drop(file);
    if handle.is_null() {
        // SAFETY: dlerror returns NULL or a C string valid until the next dl* call here.
        let reason = unsafe { libc::dlerror() };
        let reason = if reason.is_null() {
            "unknown error".to_string()
        } else {
            // SAFETY: non-NULL, NUL-terminated, copied at once.
            unsafe { CStr::from_ptr(reason) }.to_string_lossy().into_owned()
        };
        return Err(fail("dlopen", reason));
    }
    tracing::debug!(
        bytes = LIBRARY.len(),
        copy_ms = copied.as_secs_f64() * 1e3,
        dlopen_ms = (started.elapsed() - copied).as_secs_f64() * 1e3,
        "loaded the embedded nats-server library"
    );
    let symbol = |name: &CStr| -> Result<*mut c_void, String> {
        // SAFETY: `handle` is a live library handle (never closed) and `name` a C string.
        let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
        if p.is_null() { Err(fail("missing symbol", name.to_string_lossy().into_owned())) } else { Ok(p) }
    };
    // SAFETY: each symbol is the Go function exported under that name in `go/shim.go`, whose
    // C signature is the type it is turned into.
    unsafe {
        Ok(Shim {
            start: std::mem::transmute::<*mut c_void, StrArgFn>(symbol(c"KineNatsStart")?),
            wait_ready: std::mem::transmute::<*mut c_void, TimeoutFn>(symbol(c"KineNatsWaitReady")?),
            info: std::mem::transmute::<*mut c_void, StrFn>(symbol(c"KineNatsInfo")?),
            next_log: std::mem::transmute::<*mut c_void, TimeoutFn>(symbol(c"KineNatsNextLog")?),
            shutdown: std::mem::transmute::<*mut c_void, unsafe extern "C" fn()>(symbol(c"KineNatsShutdown")?),
            account_of: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*const c_char, u64) -> *mut c_char>(
                symbol(c"KineNatsAccountOf")?,
            ),
            stream_last_seq: std::mem::transmute::<*mut c_void, LastSeqFn>(symbol(c"KineNatsStreamLastSeq")?),
            free: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut c_char)>(symbol(c"KineNatsFree")?),
            bolt: crate::bolt_fns::Fns::load(symbol)?,
        })
    }
}

impl Shim {
    /// Frees memory the shim allocated (with C.CString or C.CBytes).
    pub(crate) fn free(&self, p: *mut c_char) {
        // SAFETY: `p` was allocated by the shim with malloc and is freed exactly once.
        unsafe { (self.free)(p) }
    }
}

/// Copying the library read its 19 MB out of the binary; those pages of the binary are not
/// needed again. Dropping them from this process keeps them out of its resident set (they are
/// clean file pages: the kernel reads them again should they ever be touched).
fn forget_copied_pages() {
    const PAGE: usize = 4096;
    let start = LIBRARY.as_ptr() as usize;
    let first = start.div_ceil(PAGE) * PAGE;
    let end = (start + LIBRARY.len()) / PAGE * PAGE;
    if end > first {
        // SAFETY: whole pages inside a read-only mapping of the binary file; MADV_DONTNEED on a
        // private file mapping only drops the page table entries, and the contents read back
        // are the same bytes. Best effort: the result does not matter.
        unsafe { libc::madvise(first as *mut c_void, end - first, libc::MADV_DONTNEED) };
    }
}

/// Copies a string the shim allocated and frees it; NULL is `None`.
pub(crate) fn take(shim: &Shim, p: *mut c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: a non-NULL result of the shim is a NUL-terminated C.CString that we own and
    // free exactly once, here.
    let s = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
    unsafe { (shim.free)(p) };
    Some(s)
}

fn clamp_ms(ms: u128) -> c_int {
    ms.min(c_int::MAX as u128) as c_int
}

/// Starts the server (non-blocking); `Some(error)` when it cannot be created (or the shim
/// cannot be loaded).
pub fn start(request_json: &str) -> Option<String> {
    let shim = match shim() {
        Ok(shim) => shim,
        Err(e) => return Some(e),
    };
    let request = CString::new(request_json).ok()?;
    // SAFETY: `request` is a valid C string that outlives the call; Go copies it.
    take(shim, unsafe { (shim.start)(request.as_ptr()) })
}

/// NULL = ready, `wait:<reason>`, or `fail:<reason>`.
pub fn wait_ready(timeout: std::time::Duration) -> Option<String> {
    let Some(shim) = loaded() else { return Some("fail:the embedded NATS server was never started".into()) };
    // SAFETY: plain call; the result is handled by `take`.
    take(shim, unsafe { (shim.wait_ready)(clamp_ms(timeout.as_millis())) })
}

pub fn info() -> Option<String> {
    let shim = loaded()?;
    // SAFETY: plain call; the result is handled by `take`.
    take(shim, unsafe { (shim.info)() })
}

/// The next log line, `None` after `timeout`, `Some("")` once the server is gone.
pub fn next_log(timeout: std::time::Duration) -> Option<String> {
    let Some(shim) = loaded() else { return Some(String::new()) };
    // SAFETY: plain call; the result is handled by `take`.
    take(shim, unsafe { (shim.next_log)(clamp_ms(timeout.as_millis())) })
}

/// The account of the client connection `cid` of the server `server_id`; `None` if unknown.
pub fn account_of(server_id: &str, cid: u64) -> Option<String> {
    let shim = loaded()?;
    let server_id = CString::new(server_id).ok()?;
    // SAFETY: `server_id` is a valid C string that outlives the call (Go copies it); the
    // result is handled by `take`.
    take(shim, unsafe { (shim.account_of)(server_id.as_ptr(), cid) })
}

/// The last sequence of `stream` in `account` if this server may answer for its leader, and
/// for a replicated stream how long ago the leader last heard from a quorum of its replicas;
/// `Applying` while the leader has not applied everything committed when the question began
/// (`commit`, 0 on the first call of a question, noted by it).
pub fn stream_last_seq(account: &CStr, stream: &CStr, commit: &mut u64) -> StreamHead {
    let Some(shim) = loaded() else { return StreamHead::Elsewhere };
    let mut contact_ms: i64 = -1;
    // SAFETY: both are valid C strings that outlive the call (Go copies them); `commit` and
    // `contact_ms` are valid integers the call reads and writes during the call only.
    let seq = unsafe { (shim.stream_last_seq)(account.as_ptr(), stream.as_ptr(), commit, &mut contact_ms) };
    match seq {
        -2 => StreamHead::Applying,
        s if s >= 0 => {
            StreamHead::Leader { last: s as u64, contact: u64::try_from(contact_ms).ok().map(Duration::from_millis) }
        }
        _ => StreamHead::Elsewhere,
    }
}

/// What the server in this process says of a stream's head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamHead {
    /// It does not lead the stream (or holds no such stream, or is gone).
    Elsewhere,
    /// It leads, but has not yet applied every entry committed when the question began.
    Applying,
    /// It leads: the stream's last sequence, and for a replicated stream the age of the
    /// leader's quorum contact.
    Leader { last: u64, contact: Option<Duration> },
}

/// Stops the server and waits for it; idempotent, and nothing to do if it was never loaded.
pub fn shutdown() {
    if let Some(shim) = loaded() {
        // SAFETY: plain call into Go; the shim serialises concurrent calls.
        unsafe { (shim.shutdown)() }
    }
}
