//! The structure of a bbolt file, checked before bbolt maps it: bbolt trusts its pages (a page
//! past the end of the file faults, a branch that points back up loops forever), so a damaged
//! file is refused here with a clear error instead. Checked: a valid meta page (magic, version,
//! FNV-1a checksum), every page it uses inside the file, and from the root every page of every
//! bucket reached once, with its own id, a known type, and elements inside the page.

use std::collections::HashSet;
use std::fs::File;
use std::os::unix::fs::FileExt;

/// Where the file's bytes are read from: the file, or (fuzzing) a buffer.
pub trait Bytes {
    /// Exactly `buf.len()` bytes at `offset`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()>;
}

impl Bytes for File {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.read_exact_at(buf, offset)
    }
}

impl Bytes for [u8] {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let start = usize::try_from(offset).ok().filter(|&s| s <= self.len());
        match start.and_then(|s| self.get(s..s.checked_add(buf.len())?)) {
            Some(src) => {
                buf.copy_from_slice(src);
                Ok(())
            }
            None => Err(std::io::ErrorKind::UnexpectedEof.into()),
        }
    }
}

const MAGIC: u32 = 0xED0C_DAED;
const BRANCH: u16 = 0x01;
const LEAF: u16 = 0x02;
const BUCKET_LEAF: u32 = 0x01;
/// Trees and nested buckets deeper than this together are refused (etcd's buckets are one
/// level deep, and a B+tree of 4 KiB pages holding a terabyte is five levels deep).
const MAX_DEPTH: usize = 64;

struct Meta {
    page_size: u64,
    root: u64,
    pages: u64,
    txid: u64,
}

fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes(b[i..i + 2].try_into().expect("2 bytes"))
}
fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"))
}

fn meta(file: &(impl Bytes + ?Sized), offset: u64) -> Option<Meta> {
    let mut page = [0u8; 80];
    file.read_at(&mut page, offset).ok()?;
    let m = &page[16..];
    let fnv = m[..56].iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    (u32_at(m, 0) == MAGIC && u32_at(m, 4) == 2 && fnv == u64_at(m, 56)).then(|| Meta {
        page_size: u64::from(u32_at(m, 8)),
        root: u64_at(m, 16),
        pages: u64_at(m, 40),
        txid: u64_at(m, 48),
    })
}

/// Checks the bbolt file whose first `body` bytes are the database.
pub fn check(file: &(impl Bytes + ?Sized), body: u64) -> Result<(), String> {
    let first = meta(file, 0);
    let second = meta(file, first.as_ref().map_or(4096, |m| m.page_size));
    let Some(meta) = [first, second].into_iter().flatten().max_by_key(|m| m.txid) else {
        return Err(
            "neither an etcd snapshot (a bbolt file) nor a kine-rs snapshot, or both bbolt meta pages are damaged"
                .into(),
        );
    };
    if !(512..=1 << 16).contains(&meta.page_size) || !meta.page_size.is_power_of_two() {
        return Err(format!("bbolt page size {} is not one bbolt writes", meta.page_size));
    }
    if meta.pages.saturating_mul(meta.page_size) > body || meta.pages < 3 {
        return Err(format!(
            "truncated: its meta page says {} pages of {} bytes, the file holds {body} bytes",
            meta.pages, meta.page_size
        ));
    }
    Tree { file, meta: &meta, seen: HashSet::new() }.page(meta.root, 0)
}

struct Tree<'a, B: Bytes + ?Sized> {
    file: &'a B,
    meta: &'a Meta,
    seen: HashSet<u64>,
}

impl<B: Bytes + ?Sized> Tree<'_, B> {
    fn page(&mut self, id: u64, depth: usize) -> Result<(), String> {
        let damaged = |what: String| Err(format!("the bbolt file is damaged: page {id}: {what}"));
        if depth > MAX_DEPTH {
            return damaged("the tree is deeper than any bbolt writes".into());
        }
        if id < 2 || id >= self.meta.pages {
            return damaged(format!("outside the {} pages in use", self.meta.pages));
        }
        let mut head = [0u8; 16];
        self.file.read_at(&mut head, id * self.meta.page_size).map_err(|e| e.to_string())?;
        let overflow = u64::from(u32_at(&head, 12));
        if u64_at(&head, 0) != id {
            return damaged(format!("it says it is page {}", u64_at(&head, 0)));
        }
        if id + overflow >= self.meta.pages {
            return damaged("it runs past the pages in use".into());
        }
        for p in id..=id + overflow {
            if !self.seen.insert(p) {
                return damaged("reached twice".into());
            }
        }
        let mut data = vec![0u8; ((overflow + 1) * self.meta.page_size) as usize];
        self.file.read_at(&mut data, id * self.meta.page_size).map_err(|e| e.to_string())?;
        self.node(&data, depth).or_else(damaged)
    }

    /// A branch or leaf node: the page header and the elements after it, all inside `data`.
    fn node(&mut self, data: &[u8], depth: usize) -> Result<(), String> {
        let (flags, count) = (u16_at(data, 8), usize::from(u16_at(data, 10)));
        if 16 + count * 16 > data.len() {
            return Err(format!("{count} elements do not fit"));
        }
        for i in 0..count {
            let at = 16 + i * 16;
            let e = &data[at..at + 16];
            match flags {
                BRANCH => {
                    let (pos, ksize) = (u32_at(e, 0) as usize, u32_at(e, 4) as usize);
                    if at + pos + ksize > data.len() {
                        return Err(format!("element {i} runs past the page"));
                    }
                    let child = u64_at(e, 8);
                    self.page(child, depth + 1)?;
                }
                LEAF => {
                    let (kind, pos, ksize, vsize) =
                        (u32_at(e, 0), u32_at(e, 4) as usize, u32_at(e, 8) as usize, u32_at(e, 12) as usize);
                    let value_at = at + pos + ksize;
                    if value_at + vsize > data.len() {
                        return Err(format!("element {i} runs past the page"));
                    }
                    if kind & BUCKET_LEAF != 0 {
                        self.bucket(&data[value_at..value_at + vsize], depth + 1)?;
                    }
                }
                other => return Err(format!("type {other:#x} is neither a branch nor a leaf")),
            }
        }
        Ok(())
    }

    /// A nested bucket's value: its root page, or an inline leaf after the 16-byte header.
    fn bucket(&mut self, value: &[u8], depth: usize) -> Result<(), String> {
        if depth > MAX_DEPTH {
            return Err("buckets nested too deep".into());
        }
        if value.len() < 16 {
            return Err("a bucket's header is cut short".into());
        }
        match u64_at(value, 0) {
            0 if value.len() >= 32 && u16_at(&value[16..], 8) == LEAF => self.node(&value[16..], depth),
            0 => Err("an inline bucket is not a leaf".into()),
            root => self.page(root, depth),
        }
    }
}
