//! A pack's packed weights kept next to it, so that a warm load reads them back instead of
//! packing.
//!
//! The first load of a GGUF pack packs the decoder's matrices for the packed kernels
//! ([`crate::decoder::DecoderWeights::for_serving`]) and then writes every matrix it serves packed
//! only into `.packed.bin` in the pack's directory (written to a temporary name and renamed, so
//! a reader never sees half a file). The next load of the same file reads those matrices' packed
//! bytes straight into memory the process owns and never reads their GGUF rows or packs them.
//!
//! The file is trusted only as far as it is checked:
//! - it names the weights file it was made from (device, inode, length, modification time): a
//!   replaced or rewritten file does not match, and the matrices are packed again and the cache
//!   rewritten;
//! - it carries the packed layout's version ([`LAYOUT_VERSION`]): a build with another layout
//!   packs again;
//! - its index and every matrix carry a CRC-32: a damaged entry is packed again from the GGUF;
//! - a matrix is taken from it only when the kernels that run here take its type
//!   ([`PackedMatrix::covers`]; both kernel sets read the one layout).
//!
//! Nothing is kept open: like every other weight, the packed bytes are read at load into memory
//! the process owns, so the rule for a live store (docs/serve.md) is unchanged. A directory the
//! process may not write to means no cache (every load packs). `BERTH_PACK_CACHE=0` turns the
//! cache off.

use berth_kernels::packed::{PackedMatrix, LAYOUT_VERSION};
use berth_kernels::quant::WeightType;
use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// The cache's file name in the pack's directory (hidden, like the store's own stamps, so
/// listings and copies of a pack's files leave it out).
pub const FILE_NAME: &str = ".packed.bin";

/// First bytes of the file.
const MAGIC: &[u8; 8] = b"BERTHPKD";
/// Version of the file's own format (header and index), apart from the packed layout's.
const FORMAT: u32 = 1;
/// Matrices start on page boundaries in the file, so each is read with aligned I/O.
const ALIGN: u64 = 4096;

/// Which weights file a cache was made from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SourceId {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: i64,
    mtime_nsec: i64,
}

impl SourceId {
    /// The identity of the file `meta` describes.
    pub fn of(meta: &std::fs::Metadata) -> SourceId {
        SourceId {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            mtime: meta.mtime(),
            mtime_nsec: meta.mtime_nsec(),
        }
    }

    fn to_bytes(self) -> [u8; 40] {
        let mut b = [0u8; 40];
        for (i, v) in [
            self.dev,
            self.ino,
            self.len,
            self.mtime as u64,
            self.mtime_nsec as u64,
        ]
        .into_iter()
        .enumerate()
        {
            b[8 * i..8 * i + 8].copy_from_slice(&v.to_le_bytes());
        }
        b
    }
}

/// One matrix in the file.
#[derive(Clone, Debug, PartialEq)]
struct Entry {
    wtype: WeightType,
    rows: u64,
    k: u64,
    offset: u64,
    len: u64,
    crc: u32,
}

/// The packed-weights cache of one pack's GGUF, as one load uses it.
pub struct PackCache {
    path: PathBuf,
    source: SourceId,
    /// The file as found at open, when it was made from `source` under this layout.
    found: Option<(File, HashMap<String, Entry>)>,
    /// Matrices read back packed so far.
    read: AtomicUsize,
    /// Set once the file has been written (or found complete) by this load.
    written: Mutex<bool>,
}

impl std::fmt::Debug for PackCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PackCache({})", self.path.display())
    }
}

/// Whether `BERTH_PACK_CACHE` leaves the cache on (anything but `0`, `false`, `off`, `no`).
pub fn cache_wanted() -> bool {
    wanted(std::env::var("BERTH_PACK_CACHE").ok().as_deref())
}

fn wanted(setting: Option<&str>) -> bool {
    !matches!(setting.map(str::trim), Some("0" | "false" | "off" | "no"))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Bytes of the fixed header: magic, format, layout, source, entry count, index length.
const HEADER: usize = 8 + 4 + 4 + 40 + 4 + 4;

impl PackCache {
    /// The cache for the GGUF in `pack_dir` whose identity is `source`: the file there is
    /// read (header and index only) when it matches.
    pub fn open(pack_dir: &Path, source: SourceId) -> PackCache {
        let path = pack_dir.join(FILE_NAME);
        let found = File::open(&path)
            .ok()
            .and_then(|f| Self::index(&f, source).map(|ix| (f, ix)));
        PackCache {
            path,
            source,
            found,
            read: AtomicUsize::new(0),
            written: Mutex::new(false),
        }
    }

    /// The index of `f` when it is a cache of `source` under this format and layout, intact.
    fn index(f: &File, source: SourceId) -> Option<HashMap<String, Entry>> {
        let mut head = [0u8; HEADER];
        f.read_exact_at(&mut head, 0).ok()?;
        if &head[..8] != MAGIC
            || u32_at(&head, 8)? != FORMAT
            || u32_at(&head, 12)? != LAYOUT_VERSION
            || head[16..56] != source.to_bytes()
        {
            return None;
        }
        let (count, index_len) = (u32_at(&head, 56)? as usize, u32_at(&head, 60)? as usize);
        let mut index = vec![0u8; index_len + 4];
        f.read_exact_at(&mut index, HEADER as u64).ok()?;
        let crc = u32_at(&index, index_len)?;
        let mut h = crc32fast::Hasher::new();
        h.update(&head);
        h.update(&index[..index_len]);
        if h.finalize() != crc {
            return None;
        }
        let mut out = HashMap::with_capacity(count);
        let mut at = 0;
        for _ in 0..count {
            let n = u16::from_le_bytes(index.get(at..at + 2)?.try_into().ok()?) as usize;
            let name = std::str::from_utf8(index.get(at + 2..at + 2 + n)?)
                .ok()?
                .to_string();
            at += 2 + n;
            let entry = Entry {
                wtype: WeightType::from_ggml_id(u32_at(&index, at)?)?,
                rows: u64_at(&index, at + 4)?,
                k: u64_at(&index, at + 12)?,
                offset: u64_at(&index, at + 20)?,
                len: u64_at(&index, at + 28)?,
                crc: u32_at(&index, at + 36)?,
            };
            at += 40;
            out.insert(name, entry);
        }
        (at == index_len).then_some(out)
    }

    /// Matrix `name` (`rows` × `k` of `wtype` in the GGUF) read back packed, or None when the
    /// cache does not hold it as that, the kernels here do not take it, or its bytes fail their
    /// check (then it is packed from the GGUF, and the cache rewritten after the load).
    pub fn read(&self, name: &str, wtype: WeightType, rows: usize, k: usize) -> Option<PackedMatrix> {
        let got = self.try_read(name, wtype, rows, k);
        if got.is_some() {
            self.read.fetch_add(1, Ordering::Relaxed);
        }
        got
    }

    fn try_read(&self, name: &str, wtype: WeightType, rows: usize, k: usize) -> Option<PackedMatrix> {
        let (file, index) = self.found.as_ref()?;
        let e = index.get(name)?;
        if (e.wtype, e.rows, e.k) != (wtype, rows as u64, k as u64)
            || PackedMatrix::packed_len(wtype, rows, k) != Some(e.len as usize)
        {
            return None;
        }
        PackedMatrix::from_packed_bytes(wtype, rows, k, |buf| {
            file.read_exact_at(buf, e.offset)?;
            if crc32fast::hash(buf) == e.crc {
                Ok(())
            } else {
                Err(std::io::Error::other("checksum"))
            }
        })?
        .ok()
    }

    /// Matrices this load read back packed so far.
    pub fn read_count(&self) -> usize {
        self.read.load(Ordering::Relaxed)
    }

    /// Writes `matrices` (name, packed form, and whether it was read from this cache) as the
    /// pack's cache, unless every one was read from it or this load wrote it already; true
    /// when written. Written to a temporary name in the same directory and renamed over the
    /// old file. A directory the process may not write to is no error (the next load packs
    /// again); any other failure is returned.
    pub fn store(&self, matrices: &[(&str, &PackedMatrix, bool)]) -> std::io::Result<bool> {
        let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        if *written || matrices.iter().all(|m| m.2) {
            return Ok(false);
        }
        let tmp = self.path.with_file_name(format!(
            "{FILE_NAME}.tmp-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        ));
        let result = self
            .write_to(&tmp, matrices)
            .and_then(|()| std::fs::rename(&tmp, &self.path));
        match result {
            Ok(()) => {
                *written = true;
                Ok(true)
            }
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                if e.kind() == std::io::ErrorKind::PermissionDenied
                    || e.kind() == std::io::ErrorKind::ReadOnlyFilesystem
                {
                    Ok(false)
                } else {
                    Err(e)
                }
            }
        }
    }

    fn write_to(&self, tmp: &Path, matrices: &[(&str, &PackedMatrix, bool)]) -> std::io::Result<()> {
        let index_len: usize = matrices.iter().map(|(n, ..)| 2 + n.len() + 40).sum();
        let mut offset = (HEADER + index_len + 4) as u64;
        let mut index = Vec::with_capacity(index_len);
        let mut places = Vec::with_capacity(matrices.len());
        for (name, p, _) in matrices {
            let n = u16::try_from(name.len()).map_err(std::io::Error::other)?;
            offset = offset.next_multiple_of(ALIGN);
            let bytes = p.packed_bytes();
            index.extend_from_slice(&n.to_le_bytes());
            index.extend_from_slice(name.as_bytes());
            index.extend_from_slice(&p.wtype().ggml_id().to_le_bytes());
            for v in [p.rows() as u64, p.k() as u64, offset, bytes.len() as u64] {
                index.extend_from_slice(&v.to_le_bytes());
            }
            index.extend_from_slice(&crc32fast::hash(bytes).to_le_bytes());
            places.push(offset);
            offset += bytes.len() as u64;
        }
        let mut head = Vec::with_capacity(HEADER);
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&FORMAT.to_le_bytes());
        head.extend_from_slice(&LAYOUT_VERSION.to_le_bytes());
        head.extend_from_slice(&self.source.to_bytes());
        head.extend_from_slice(&(matrices.len() as u32).to_le_bytes());
        head.extend_from_slice(&(index_len as u32).to_le_bytes());
        let mut h = crc32fast::Hasher::new();
        h.update(&head);
        h.update(&index);
        let mut f = File::create(tmp)?;
        f.write_all(&head)?;
        f.write_all(&index)?;
        f.write_all(&h.finalize().to_le_bytes())?;
        for ((_, p, _), at) in matrices.iter().zip(places) {
            f.write_all_at(p.packed_bytes(), at)?;
        }
        // No fsync: a file cut short by a crash fails its checksums and is packed again.
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::Weights;
    use berth_formats::gguf::GgmlType;
    use berth_formats::testutil::GgufWriter;

    /// A GGUF with two packable matrices (Q8_0, Q4_K), one whose rows are not whole groups, and
    /// a stack of three (MoE experts).
    fn write_gguf(path: &Path) {
        let bytes = GgufWriter::new()
            .tensor("a.weight", &[64, 32], GgmlType::Q8_0)
            .tensor("b.weight", &[256, 48], GgmlType::Q4_K)
            .tensor("c.weight", &[64, 15], GgmlType::Q8_0)
            .tensor("e.weight", &[64, 32, 3], GgmlType::Q8_0)
            .build();
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, bytes).unwrap();
        // A new file each time (as `berth pull` writes one): a new inode.
        std::fs::rename(&tmp, path).unwrap();
    }

    /// One load: the three matrices as served (packed ones held only packed), what the cache gave.
    fn load(dir: &Path) -> (Vec<crate::weights::Matrix>, Arc<PackCache>) {
        let w = Weights::open_gguf(dir.join("model.gguf"))
            .unwrap()
            .with_pack_cache(dir)
            .unwrap();
        let mut ms = ["a.weight", "b.weight", "c.weight"]
            .map(|n| w.matrix_named(n).unwrap())
            .to_vec();
        ms.extend(w.stacked_named("e.weight").unwrap());
        let ms = ms.iter().map(|m| m.for_serving(false)).collect();
        (ms, w.pack_cache().unwrap().clone())
    }

    fn store(ms: &[crate::weights::Matrix], cache: &PackCache) -> bool {
        let entries: Vec<_> = ms
            .iter()
            .filter_map(|m| m.cache_entry().map(|(_, n, p, hit)| (n, p, hit)))
            .collect();
        cache.store(&entries).unwrap()
    }

    use std::sync::Arc;

    #[test]
    fn a_second_load_reads_back_what_the_first_packed_and_a_changed_file_packs_again() {
        if !PackedMatrix::covers(WeightType::Q8_0) || !PackedMatrix::covers(WeightType::Q4_K) {
            eprintln!("skipped: no packed kernels on this CPU or under BERTH_KERNELS");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        write_gguf(&dir.path().join("model.gguf"));
        let (first, cache) = load(dir.path());
        assert_eq!(cache.read_count(), 0, "no cache yet");
        assert!(store(&first, &cache), "the first load writes the cache");
        assert!(dir.path().join(FILE_NAME).is_file());
        // No temporary file is left beside it.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");

        let (second, cache) = load(dir.path());
        assert_eq!(cache.read_count(), 5, "every packable matrix comes back packed");
        for (a, b) in first.iter().zip(&second) {
            assert_eq!(a.has_rows(), b.has_rows(), "{a:?}");
            assert_eq!(
                a.packed().map(PackedMatrix::packed_bytes),
                b.packed().map(PackedMatrix::packed_bytes),
                "{a:?}"
            );
        }
        assert!(!second[0].has_rows() && !second[1].has_rows() && second[2].has_rows());
        assert!(second[3..].iter().all(|m| !m.has_rows()), "the experts too");
        assert!(!store(&second, &cache), "nothing new to write");

        // A damaged matrix is packed again from the GGUF; the others still come back.
        let path = dir.path().join(FILE_NAME);
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x55;
        std::fs::write(&path, &bytes).unwrap();
        let (third, cache) = load(dir.path());
        // The last matrix written is the last expert: the stack is read and packed again.
        assert_eq!(cache.read_count(), 4, "the damaged matrix is not taken");
        assert!(third[3..].iter().all(|m| m.cache_entry().is_some_and(|e| !e.3)));
        assert_eq!(
            third[5].packed().unwrap().packed_bytes(),
            first[5].packed().unwrap().packed_bytes()
        );
        assert!(store(&third, &cache), "the cache is written again");
        assert_eq!(load(dir.path()).1.read_count(), 5);

        // A damaged index, or a replaced weights file, gives nothing from the cache.
        bytes = std::fs::read(&path).unwrap();
        bytes[HEADER + 3] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(load(dir.path()).1.read_count(), 0, "index checksum");
        let (fourth, cache) = load(dir.path());
        assert!(store(&fourth, &cache));
        write_gguf(&dir.path().join("model.gguf"));
        let (fifth, cache) = load(dir.path());
        assert_eq!(cache.read_count(), 0, "another file, even with the same bytes");
        assert_eq!(
            fifth[0].packed().unwrap().packed_bytes(),
            first[0].packed().unwrap().packed_bytes()
        );
    }

    #[test]
    fn the_cache_can_be_turned_off() {
        for (v, on) in [(Some("0"), false), (Some("off"), false), (Some(" no "), false)] {
            assert_eq!(wanted(v), on, "{v:?}");
        }
        for v in [None, Some("1"), Some(""), Some("yes")] {
            assert!(wanted(v), "{v:?}");
        }
    }
}
