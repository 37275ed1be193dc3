//! The table of the Go shim's bbolt functions (`go/bolt.go`), loaded with the rest of the shim
//! (`ffi.rs`) and called by `bolt.rs`.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_void};

type OpenFn = unsafe extern "C" fn(*const c_char, c_int, *mut *mut c_char) -> usize;
type PutFn = unsafe extern "C" fn(usize, *const c_char, usize) -> *mut c_char;
type PathFn = unsafe extern "C" fn(usize, *const c_char) -> *mut c_char;
type ScanFn = unsafe extern "C" fn(
    usize,
    *const c_char,
    usize,
    *const c_char,
    usize,
    usize,
    *mut *mut c_char,
    *mut usize,
) -> *mut c_char;
type HandleFn = unsafe extern "C" fn(usize) -> *mut c_char;

/// The shim's bbolt functions.
pub(crate) struct Fns {
    pub(crate) open: OpenFn,
    pub(crate) put: PutFn,
    pub(crate) write_to: PathFn,
    pub(crate) scan: ScanFn,
    pub(crate) close: HandleFn,
}

impl Fns {
    /// # Safety
    /// `symbol` returns the address of the Go function exported under that name by
    /// `go/bolt.go`, whose C signature is the type it is turned into here.
    pub(crate) unsafe fn load(symbol: impl Fn(&std::ffi::CStr) -> Result<*mut c_void, String>) -> Result<Fns, String> {
        // SAFETY: see above.
        unsafe {
            Ok(Fns {
                open: std::mem::transmute::<*mut c_void, OpenFn>(symbol(c"KineBoltOpen")?),
                put: std::mem::transmute::<*mut c_void, PutFn>(symbol(c"KineBoltPut")?),
                write_to: std::mem::transmute::<*mut c_void, PathFn>(symbol(c"KineBoltWriteTo")?),
                scan: std::mem::transmute::<*mut c_void, ScanFn>(symbol(c"KineBoltScan")?),
                close: std::mem::transmute::<*mut c_void, HandleFn>(symbol(c"KineBoltClose")?),
            })
        }
    }
}
