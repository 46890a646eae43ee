//! Zeroed, cache-line-aligned byte storage for large weights, backed by transparent huge pages
//! where the OS gives them.
//!
//! A decode step streams every weight once: with 4 KiB pages that is a TLB miss and a page walk
//! every 4 KiB of every matrix (Qwen2.5 0.5B: 120k pages per token). Storage of 2 MiB and more
//! is mapped on its own, aligned to 2 MiB and marked `MADV_HUGEPAGE` before anything is
//! written, so the kernel backs it with 2 MiB pages when it has them (Linux with transparent
//! huge pages set to `madvise` or `always`). `BERTH_HUGEPAGES=0` turns this off. Resident
//! memory is the same either way: only the whole 2 MiB extents inside the storage are huge.

/// Bytes of a huge page (x86-64).
const HUGE: usize = 2 << 20;

/// A 64-byte-aligned type, for an empty buffer's (dangling, aligned) pointer.
#[repr(C, align(64))]
struct Align64([u8; 64]);

/// Zeroed storage of a fixed length, 64-byte aligned, freed on drop.
pub struct PageBuf {
    ptr: *mut u8,
    len: usize,
    /// How it was allocated, to free it the same way.
    kind: Alloc,
}

enum Alloc {
    /// Nothing allocated (length 0).
    Empty,
    /// From the global allocator with this layout.
    Heap(std::alloc::Layout),
    /// An anonymous mapping of this many bytes.
    #[cfg(target_os = "linux")]
    Mapped(usize),
}

// SAFETY: `PageBuf` owns its bytes exclusively (like a `Box<[u8]>`); shared references give
// only `&[u8]`, so sending or sharing it across threads is as sound as for a boxed slice.
unsafe impl Send for PageBuf {}
// SAFETY: see `Send`: `&PageBuf` allows reads only.
unsafe impl Sync for PageBuf {}

impl PageBuf {
    /// `len` zero bytes, in huge pages where they are worth it and the OS allows.
    pub fn zeroed(len: usize) -> PageBuf {
        if len == 0 {
            return PageBuf {
                ptr: std::ptr::NonNull::<Align64>::dangling().as_ptr() as *mut u8,
                len,
                kind: Alloc::Empty,
            };
        }
        #[cfg(target_os = "linux")]
        if len >= HUGE && huge_pages_wanted() {
            if let Some(buf) = Self::mapped(len) {
                return buf;
            }
        }
        let layout = std::alloc::Layout::from_size_align(len, 64).expect("a valid layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        PageBuf {
            ptr,
            len,
            kind: Alloc::Heap(layout),
        }
    }

    /// An anonymous mapping of `len` bytes starting on a 2 MiB boundary, marked for huge pages;
    /// None if the OS refuses the mapping.
    #[cfg(target_os = "linux")]
    fn mapped(len: usize) -> Option<PageBuf> {
        let size = len.next_multiple_of(4096);
        // Map 2 MiB more, then unmap the unaligned head and the tail beyond `size`.
        let span = size + HUGE;
        // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                span,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return None;
        }
        let start = raw as usize;
        let aligned = start.next_multiple_of(HUGE);
        // SAFETY: both ranges lie inside the mapping just made and are page-aligned (mmap
        // returns page-aligned memory; `aligned` and `aligned + size` are multiples of 4096).
        unsafe {
            if aligned > start {
                libc::munmap(raw, aligned - start);
            }
            let end = aligned + size;
            if start + span > end {
                libc::munmap(end as *mut libc::c_void, start + span - end);
            }
            // A hint: refused (no THP support), the mapping still works with small pages.
            libc::madvise(aligned as *mut libc::c_void, size, libc::MADV_HUGEPAGE);
        }
        Some(PageBuf {
            ptr: aligned as *mut u8,
            len,
            kind: Alloc::Mapped(size),
        })
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` points to `len` initialised (zeroed, then written) bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// Whether the storage was mapped for huge pages (whether the OS gave them is its choice).
    pub fn huge(&self) -> bool {
        #[cfg(target_os = "linux")]
        if let Alloc::Mapped(_) = self.kind {
            return true;
        }
        false
    }
}

impl Drop for PageBuf {
    fn drop(&mut self) {
        match self.kind {
            Alloc::Empty => {}
            // SAFETY: allocated by `alloc_zeroed` with exactly this layout.
            Alloc::Heap(layout) => unsafe { std::alloc::dealloc(self.ptr, layout) },
            // SAFETY: the mapping made in `mapped`, of exactly this size, unmapped once.
            #[cfg(target_os = "linux")]
            Alloc::Mapped(size) => unsafe {
                libc::munmap(self.ptr as *mut libc::c_void, size);
            },
        }
    }
}

/// Whether large weights should ask for huge pages: unless `BERTH_HUGEPAGES=0`.
fn huge_pages_wanted() -> bool {
    static WANTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WANTED.get_or_init(|| std::env::var("BERTH_HUGEPAGES").map_or(true, |v| v.trim() != "0"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storage_is_zeroed_aligned_and_writable_at_every_size() {
        for len in [0, 1, 4096, HUGE - 64, HUGE, 3 * HUGE + 4160] {
            let mut b = PageBuf::zeroed(len);
            assert_eq!(b.as_slice().len(), len);
            assert!(b.as_slice().iter().all(|&x| x == 0), "{len}");
            assert_eq!(b.as_slice().as_ptr() as usize % 64, 0);
            if len >= HUGE && huge_pages_wanted() && cfg!(target_os = "linux") {
                assert!(b.huge());
                assert_eq!(b.as_slice().as_ptr() as usize % HUGE, 0);
            }
            for (i, x) in b.as_mut_slice().iter_mut().enumerate() {
                *x = i as u8;
            }
            assert!(b.as_slice().iter().enumerate().all(|(i, &x)| x == i as u8));
        }
    }
}
