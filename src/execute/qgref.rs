//! Reference distributions on disk: quantgate's compact reference cache,
//! and llama-perplexity's `--kl-divergence-base` files as an import.
//!
//! Cache layout (little-endian), version 2: `QGKLDREF`, u32 version, u32
//! header length, the header as JSON, then per position u32 n_kept, f32
//! max, f64 lse, f64 lp_true, f64 tail_mass, the kept ids in increasing
//! order as LEB128 gaps, their f32 logits in that order, and when n_kept <
//! n_vocab the tail: f32 hi, f64 Σ p·(l − max), f64 Σ (p̃ − p)·(l − max),
//! [`LEVELS`] f32 level shares of the tail mass, [`LEVELS`] LEB128 level
//! counts, u32 length and the tail levels of the ids not kept, in
//! vocabulary order, rANS coded with those counts as the model
//! (`execute::rangecoder::rans`); finally the sha256 of everything before
//! it. Reading checks
//! every byte: magic, version, header equal to what the case expects,
//! record bounds, exact length, trailing hash, finite values, a code that
//! decodes exactly to levels with the stored counts. Version 1 (a byte per vocabulary entry on 255
//! levels) is refused by its version, and the store rebuilds it.
//!
//! Contract: a file that fails any check is an error naming the file and
//! the offset or field, never a partial result.

use crate::core::auth::{Seal, SealHasher};
use crate::core::error::Malformed;
use crate::core::fsutil::{seal_with, sha256_bytes, unseal_with};
use crate::execute::rans;
use crate::measure::kld::{order_key, RefPosition, KEPT, LEVELS};
use serde::{Deserialize, Serialize};

const MAGIC: &[u8; 8] = b"QGKLDREF";
const VERSION: u32 = 2;

/// What a cache holds and was computed from; its hash is the file name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheHeader {
    /// Reference model sha256.
    pub reference_sha256: String,
    /// Scored token stream sha256.
    pub token_stream_sha256: String,
    /// Windowing, as the case declares it.
    pub windowing: String,
    /// Engine settings that change logits.
    pub settings: String,
    /// llama.cpp build.
    pub build: String,
    /// Tail mass left out per row.
    pub tail: f64,
    /// Cap on kept entries per row.
    pub max_kept: usize,
    /// Scored positions.
    pub positions: usize,
    /// Vocabulary size of the reference.
    pub n_vocab: usize,
    /// The reference's tokenizer fingerprint (filled when written).
    pub tokenizer_fingerprint: String,
}

impl CacheHeader {
    /// The content address: sha256 of the fields that determine the rows.
    pub(crate) fn key(&self) -> String {
        sha256_bytes(
            format!(
                "{}|{}|{}|{}|{}|{:e}|{}|{}",
                self.reference_sha256,
                self.token_stream_sha256,
                self.windowing,
                self.settings,
                self.build,
                self.tail,
                self.max_kept,
                self.positions
            )
            .as_bytes(),
        )
    }
}

/// Serialize a cache, sealed with `seal`.
pub fn encode(header: &CacheHeader, rows: &[RefPosition], seal: Seal) -> Vec<u8> {
    let entries: usize = rows.iter().map(|r| r.entries.len()).sum();
    let mut out = Vec::with_capacity(256 + rows.len() * (32 + 4 * LEVELS) + entries * 8);
    encode_head(&mut out, header);
    for r in rows {
        encode_row(&mut out, r);
    }
    seal_with(out, seal)
}

/// The magic, version and header.
fn encode_head(out: &mut Vec<u8>, header: &CacheHeader) {
    let h = serde_json::to_vec(header).expect("a header serializes");
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(h.len() as u32).to_le_bytes());
    out.extend_from_slice(&h);
}

/// One position's record.
fn encode_row(out: &mut Vec<u8>, r: &RefPosition) {
    {
        out.extend_from_slice(&(r.entries.len() as u32).to_le_bytes());
        out.extend_from_slice(&r.max.to_le_bytes());
        out.extend_from_slice(&r.lse.to_le_bytes());
        out.extend_from_slice(&r.lp_true.to_le_bytes());
        out.extend_from_slice(&r.tail_mass.to_le_bytes());
        // Kept entries by id: the id gaps as LEB128, then the logits.
        let mut by_id = r.entries.clone();
        by_id.sort_unstable_by_key(|e| e.0);
        let mut prev = 0u32;
        for (k, &(id, _)) in by_id.iter().enumerate() {
            let gap = if k == 0 { id } else { id - prev - 1 };
            leb128(out, gap);
            prev = id;
        }
        for &(_, l) in &by_id {
            out.extend_from_slice(&l.to_le_bytes());
        }
        if let Some(t) = &r.tail {
            out.extend_from_slice(&t.hi.to_le_bytes());
            out.extend_from_slice(&t.mean_logit.to_le_bytes());
            out.extend_from_slice(&t.rounding.to_le_bytes());
            for m in &t.masses {
                out.extend_from_slice(&m.to_le_bytes());
            }
            for &c in &t.counts[..LEVELS] {
                leb128(out, c);
            }
            let coded = code_levels(t);
            out.extend_from_slice(&(coded.len() as u32).to_le_bytes());
            out.extend_from_slice(&coded);
        }
    }
}

/// A cache written as its rows come (a reference decode), never held
/// whole: the records go to a temp file beside the destination, hashed as
/// they go, sealed and moved into place by [`RowWriter::finish`] only when
/// every position was written; dropped before, the temp file goes.
pub(crate) struct RowWriter {
    file: std::io::BufWriter<tempfile::NamedTempFile>,
    hash: SealHasher,
    dest: std::path::PathBuf,
    header: CacheHeader,
    written: usize,
    buf: Vec<u8>,
}

impl RowWriter {
    /// Start the cache of `header` (its `n_vocab` and fingerprint filled)
    /// at `dest`, to be sealed with `seal`.
    pub(crate) fn create(
        dest: &std::path::Path,
        header: CacheHeader,
        seal: Seal,
    ) -> crate::core::error::Result<Self> {
        let tmp = crate::core::fsutil::temp_beside(dest)?;
        let mut w = RowWriter {
            file: std::io::BufWriter::with_capacity(1 << 20, tmp),
            hash: seal.hasher(),
            dest: dest.to_path_buf(),
            header,
            written: 0,
            buf: Vec::new(),
        };
        let mut head = Vec::new();
        encode_head(&mut head, &w.header);
        w.write(head)?;
        Ok(w)
    }

    fn write(&mut self, bytes: Vec<u8>) -> crate::core::error::Result<()> {
        use std::io::Write;
        self.hash.update(&bytes);
        let r = self.file.write_all(&bytes);
        self.buf = bytes;
        r.map_err(|e| crate::core::error::Error::io(&self.dest, e))
    }

    /// The next position's row.
    pub(crate) fn push(&mut self, r: &RefPosition) -> crate::core::error::Result<()> {
        let mut b = std::mem::take(&mut self.buf);
        b.clear();
        encode_row(&mut b, r);
        self.written += 1;
        self.write(b)
    }

    /// Seal the file and move it into place; an error unless it holds
    /// exactly the header's positions.
    pub(crate) fn finish(self) -> crate::core::error::Result<()> {
        use std::io::Write;
        if self.written != self.header.positions {
            return Err(crate::core::error::Error::harness(format!(
                "{}: {} of {} reference positions written",
                self.dest.display(),
                self.written,
                self.header.positions
            )));
        }
        let digest = self.hash.finish();
        let mut file = self.file;
        file.write_all(&digest)
            .and_then(|()| file.flush())
            .map_err(|e| crate::core::error::Error::io(&self.dest, e))?;
        let tmp = file
            .into_inner()
            .map_err(|e| crate::core::error::Error::io(&self.dest, e.into_error()))?;
        crate::core::fsutil::commit(tmp, &self.dest)
    }
}

/// Where the record parser reads from: a whole file in memory, or a file
/// read as it goes ([`RowStream`]).
trait Source {
    /// The next `n` bytes, or why there are not that many before the seal.
    fn take(&mut self, n: usize, what: &str) -> Result<&[u8], Malformed>;
    /// The offset of the next byte.
    fn at(&self) -> usize;
    fn u32(&mut self, what: &str) -> Result<u32, Malformed> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().unwrap()))
    }
    fn f32(&mut self, what: &str) -> Result<f32, Malformed> {
        Ok(f32::from_le_bytes(self.take(4, what)?.try_into().unwrap()))
    }
    fn leb128(&mut self, what: &str) -> Result<u32, Malformed> {
        let mut v = 0u64;
        for k in 0..5 {
            let b = self.take(1, what)?[0];
            v |= u64::from(b & 0x7F) << (7 * k);
            if b & 0x80 == 0 {
                return u32::try_from(v)
                    .map_err(|_| format!("offset {}: {what} too large", self.at()).into());
            }
        }
        Err(format!("offset {}: {what}: more than 5 LEB128 bytes", self.at()).into())
    }
    fn f64(&mut self, what: &str) -> Result<f64, Malformed> {
        Ok(f64::from_le_bytes(self.take(8, what)?.try_into().unwrap()))
    }
}

/// Bytes in memory: a whole file, or one record of a file (`base` its
/// offset there, so that every message names the file's offset).
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
    base: usize,
    /// A record cut short where its file ended: the file's own error, which
    /// reading past these bytes gives.
    past_end: Option<Malformed>,
}

impl<'a> Reader<'a> {
    fn whole(b: &'a [u8], at: usize) -> Self {
        Reader {
            b,
            at,
            base: 0,
            past_end: None,
        }
    }
}

impl Source for Reader<'_> {
    fn take(&mut self, n: usize, what: &str) -> Result<&[u8], Malformed> {
        let Some(end) = self.at.checked_add(n).filter(|&e| e <= self.b.len()) else {
            if let Some(e) = &self.past_end {
                return Err(e.clone());
            }
            return Err(format!(
                "offset {}: truncated: {what} needs {n} bytes, {} left",
                self.base + self.at,
                self.b.len() - self.at
            )
            .into());
        };
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn at(&self) -> usize {
        self.base + self.at
    }
}

/// The body of a sealed file, read as it goes.
struct FileSource {
    file: std::io::BufReader<std::fs::File>,
    /// Where the body ends (the seal starts).
    end: usize,
    at: usize,
    buf: Vec<u8>,
}

impl Source for FileSource {
    fn take(&mut self, n: usize, what: &str) -> Result<&[u8], Malformed> {
        use std::io::Read;
        if self.at.checked_add(n).is_none_or(|e| e > self.end) {
            return Err(format!(
                "offset {}: truncated: {what} needs {n} bytes, {} left",
                self.at,
                self.end - self.at
            )
            .into());
        }
        self.buf.resize(n, 0);
        self.file
            .read_exact(&mut self.buf)
            .map_err(|e| format!("offset {}: {what}: {e}", self.at))?;
        self.at += n;
        Ok(&self.buf)
    }
    fn at(&self) -> usize {
        self.at
    }
}

/// A cache read a row at a time, never held whole: its seal is checked
/// first over the whole file (one streaming pass, on the file opened
/// once), then each row is parsed and checked as [`decode`] checks it when
/// it is asked for; [`RowStream::finish`] checks that every position was
/// read and nothing follows.
pub(crate) struct RowStream {
    src: FileSource,
    header: CacheHeader,
    next: usize,
}

impl RowStream {
    /// The cache at `path` checked against `expect` as [`decode`] checks
    /// it (its `seal`, magic, version and header here; its rows as they are
    /// read): None when there is no file, the reason when it is unusable.
    pub(crate) fn open(
        path: &std::path::Path,
        expect: &CacheHeader,
        seal: Seal,
    ) -> Result<Option<RowStream>, Malformed> {
        use std::io::{Read, Seek};
        let mut file = match std::fs::File::open(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.to_string().into()),
            Ok(f) => f,
        };
        let len = file.metadata().map_err(|e| e.to_string())?.len() as usize;
        let mut magic = [0u8; 8];
        if len < 8 + 32 || file.read_exact(&mut magic).is_err() || &magic != MAGIC {
            return Err("not a quantgate reference cache (magic `QGKLDREF` missing)".into());
        }
        let end = len - 32;
        file.rewind().map_err(|e| e.to_string())?;
        let mut buf = vec![0u8; 1 << 20];
        // The body [0, end), read from the start into `h`.
        let mut feed = |file: &mut std::fs::File, h: &mut SealHasher| -> Result<(), Malformed> {
            file.rewind().map_err(|e| e.to_string())?;
            let mut left = end;
            while left > 0 {
                let n = left.min(buf.len());
                file.read_exact(&mut buf[..n]).map_err(|e| e.to_string())?;
                h.update(&buf[..n]);
                left -= n;
            }
            Ok(())
        };
        let mut h = seal.hasher();
        feed(&mut file, &mut h)?;
        let mut digest = [0u8; 32];
        file.read_exact(&mut digest).map_err(|e| e.to_string())?;
        if !h.verify(&digest) {
            // The body read again for its plain sha256 only when a seal
            // failed, to tell an edit sealed again from an accident.
            let mut plain_matches = || {
                let mut p = Seal::Plain.hasher();
                feed(&mut file, &mut p).is_ok() && p.finish() == digest
            };
            return Err(seal.explain(&mut plain_matches).into());
        }
        file.seek(std::io::SeekFrom::Start(8))
            .map_err(|e| e.to_string())?;
        let mut src = FileSource {
            file: std::io::BufReader::with_capacity(1 << 20, file),
            end,
            at: 8,
            buf: Vec::new(),
        };
        let header = read_head(&mut src, expect)?;
        Ok(Some(RowStream {
            src,
            header,
            next: 0,
        }))
    }

    /// The file's header (its vocabulary size and tokenizer fingerprint).
    pub(crate) fn header(&self) -> &CacheHeader {
        &self.header
    }

    /// The next position's row.
    pub(crate) fn next_row(&mut self) -> Result<RefPosition, Malformed> {
        if self.next >= self.header.positions {
            return Err(
                format!("all {} positions were read already", self.header.positions).into(),
            );
        }
        let row = read_row(&mut self.src, &self.header, self.next)?;
        self.next += 1;
        Ok(row)
    }

    /// The next `k` positions' rows, as `k` calls of [`RowStream::next_row`]
    /// give them (the same rows, the same first error): the records are
    /// read from the file in order, then parsed and checked on up to
    /// `threads` threads (a record's rANS tail is most of a row's time, and
    /// the decoding lanes wait while a feed reads).
    pub(crate) fn next_rows(
        &mut self,
        k: usize,
        threads: usize,
    ) -> Result<Vec<RefPosition>, Malformed> {
        if threads <= 1 || k < 2 || self.next + k > self.header.positions {
            return (0..k).map(|_| self.next_row()).collect();
        }
        let mut records: Vec<(usize, Vec<u8>)> = Vec::with_capacity(k);
        for p in self.next..self.next + k {
            let start = self.src.at;
            let mut bytes = Vec::new();
            if let Err(e) = record_bytes(&mut self.src, &self.header, &mut bytes) {
                // What read_row says of the bytes there were: a bad value
                // before the cut, else the file's own error at the cut.
                let mut r = Reader {
                    b: &bytes,
                    at: 0,
                    base: start,
                    past_end: Some(e.clone()),
                };
                let cut = read_row(&mut r, &self.header, p).err().unwrap_or(e);
                // A bad row before this one is the first error.
                for (j, (start, bytes)) in records.iter().enumerate() {
                    let mut r = Reader {
                        b: bytes,
                        at: 0,
                        base: *start,
                        past_end: None,
                    };
                    read_row(&mut r, &self.header, self.next + j)?;
                }
                return Err(cut);
            }
            records.push((start, bytes));
        }
        let (first, header) = (self.next, &self.header);
        let per = k.div_ceil(threads.min(k));
        let parsed: Vec<Result<Vec<RefPosition>, Malformed>> = std::thread::scope(|scope| {
            let parts: Vec<_> = records
                .chunks(per)
                .enumerate()
                .map(|(c, part)| {
                    scope.spawn(move || {
                        part.iter()
                            .enumerate()
                            .map(|(j, (start, bytes))| {
                                let mut r = Reader {
                                    b: bytes,
                                    at: 0,
                                    base: *start,
                                    past_end: None,
                                };
                                read_row(&mut r, header, first + c * per + j)
                            })
                            .collect()
                    })
                })
                .collect();
            parts
                .into_iter()
                .map(|h| h.join().expect("a reference parser panicked"))
                .collect()
        });
        let mut rows = Vec::with_capacity(k);
        for part in parsed {
            rows.extend(part?);
        }
        self.next += k;
        Ok(rows)
    }

    /// Every position read, and nothing after them.
    pub(crate) fn finish(&self) -> Result<(), Malformed> {
        if self.next != self.header.positions || self.src.at != self.src.end {
            return Err(format!(
                "offset {}: {} of {} positions read, {} bytes left",
                self.src.at,
                self.next,
                self.header.positions,
                self.src.end - self.src.at
            )
            .into());
        }
        Ok(())
    }
}

/// Read a cache and check it against `expect` (all fields but the
/// tokenizer fingerprint, which is returned for the caller to compare).
pub fn decode(
    bytes: &[u8],
    expect: &CacheHeader,
    seal: Seal,
) -> Result<(CacheHeader, Vec<RefPosition>), Malformed> {
    if bytes.len() < 8 + 32 || &bytes[..8] != MAGIC {
        return Err("not a quantgate reference cache (magic `QGKLDREF` missing)".into());
    }
    let body = unseal_with(bytes, seal)?;
    let mut r = Reader::whole(body, 8);
    let header = read_head(&mut r, expect)?;
    let mut rows = Vec::with_capacity(header.positions);
    for p in 0..header.positions {
        rows.push(read_row(&mut r, &header, p)?);
    }
    if r.at != body.len() {
        return Err(format!(
            "offset {}: {} trailing bytes after {} positions",
            r.at,
            body.len() - r.at,
            header.positions
        )
        .into());
    }
    Ok((header, rows))
}

/// The version and header after the magic, checked against `expect` (all
/// fields but the vocabulary size and tokenizer fingerprint).
fn read_head(r: &mut impl Source, expect: &CacheHeader) -> Result<CacheHeader, Malformed> {
    let version = r.u32("version")?;
    if version != VERSION {
        return Err(format!("version {version}, this build reads {VERSION}").into());
    }
    let hl = r.u32("header length")? as usize;
    let h = r.take(hl, "header")?;
    let header: CacheHeader =
        serde_json::from_slice(h).map_err(|e| format!("offset 16: header: {e}"))?;
    let mut want = expect.clone();
    want.tokenizer_fingerprint = header.tokenizer_fingerprint.clone();
    want.n_vocab = header.n_vocab;
    if header != want {
        return Err(format!(
            "header does not match the case: file {:?}, case {:?}",
            header, want
        )
        .into());
    }
    Ok(header)
}

/// Position `p`'s record, every field checked.
fn read_row(r: &mut impl Source, header: &CacheHeader, p: usize) -> Result<RefPosition, Malformed> {
    let start = r.at();
    let bad = |what: &str| Malformed(format!("offset {start}: position {p}: {what}"));
    let n = r.u32("n_kept")? as usize;
    if n == 0 || n > header.n_vocab {
        return Err(bad(&format!(
            "{n} kept entries (vocabulary {})",
            header.n_vocab
        )));
    }
    let max = r.f32("max")?;
    let lse = r.f64("lse")?;
    let lp_true = r.f64("lp_true")?;
    let tail_mass = r.f64("tail_mass")?;
    if !max.is_finite() || !lse.is_finite() || lse < 0.0 || !lp_true.is_finite() || lp_true > 0.0 {
        return Err(bad("non-finite or impossible max/lse/lp_true"));
    }
    if !(0.0..=1.0).contains(&tail_mass) {
        return Err(bad("tail mass outside [0, 1]"));
    }
    let mut ids = Vec::with_capacity(n);
    let mut next = 0u64;
    for k in 0..n {
        let gap = r.leb128("entry id")?;
        let id = next + u64::from(gap);
        if id >= header.n_vocab as u64 {
            return Err(bad(&format!("entry {k}: id {id} outside the vocabulary")));
        }
        ids.push(id as u32);
        next = id + 1;
    }
    let mut entries = Vec::with_capacity(n);
    for &id in &ids {
        let l = r.f32("entry logit")?;
        if !l.is_finite() || l > max {
            return Err(bad(&format!("entry id {id} logit {l} is invalid")));
        }
        entries.push((id, l));
    }
    // Most probable first, ties by the lower id: the order they were kept in.
    entries.sort_by(|a, b| order_key(b.1).cmp(&order_key(a.1)).then(a.0.cmp(&b.0)));
    let tail = if n < header.n_vocab {
        let hi = r.f32("tail hi")?;
        let mean_logit = r.f64("tail mean logit")?;
        let rounding = r.f64("tail rounding")?;
        let mut masses = Vec::with_capacity(LEVELS);
        for _ in 0..LEVELS {
            masses.push(r.f32("tail level mass")?);
        }
        let mut counts = Vec::with_capacity(LEVELS);
        for _ in 0..LEVELS {
            counts.push(r.leb128("tail level count")?);
        }
        let len = r.u32("tail code length")? as usize;
        let coded = r.take(len, "tail code")?;
        if !hi.is_finite() || hi > max || !mean_logit.is_finite() || !rounding.is_finite() {
            return Err(bad(&format!("tail top {hi} or its sums are invalid")));
        }
        if masses.iter().any(|m| !m.is_finite() || *m < 0.0) {
            return Err(bad("a tail level mass is negative or not finite"));
        }
        let mut kept = vec![false; header.n_vocab];
        for &(id, _) in &entries {
            kept[id as usize] = true;
        }
        let codes = decode_levels(coded, &counts, &kept)
            .ok_or_else(|| bad("the tail code does not decode to its levels"))?;
        if tail_mass <= 0.0 {
            return Err(bad("a tail with zero mass"));
        }
        let t = crate::measure::kld::Tail::new(hi, mean_logit, rounding, masses, codes);
        if (0..LEVELS).any(|g| t.counts[g] > 0 && t.masses[g] <= 0.0) {
            return Err(bad("a tail level with ids has no mass"));
        }
        Some(t)
    } else {
        None
    };
    Ok(RefPosition {
        max,
        lse,
        entries,
        lp_true,
        tail_mass,
        tail,
        approximate: false,
    })
}

/// One position's record copied from `r` as it stands, read field by
/// field as [`read_row`] reads it (so that a file cut short gives the error
/// read_row would), its values unchecked: [`read_row`] parses and checks
/// the bytes. An error when the file ends inside it, or when its structure
/// cannot be followed (a count read_row refuses).
fn record_bytes(
    r: &mut impl Source,
    header: &CacheHeader,
    out: &mut Vec<u8>,
) -> Result<(), Malformed> {
    fn leb<S: Source>(r: &mut S, out: &mut Vec<u8>, what: &str) -> Result<(), Malformed> {
        for _ in 0..5 {
            let b = r.take(1, what)?[0];
            out.push(b);
            if b & 0x80 == 0 {
                return Ok(());
            }
        }
        Err("more than 5 LEB128 bytes".into())
    }
    fn copy<S: Source>(
        r: &mut S,
        out: &mut Vec<u8>,
        n: usize,
        what: &str,
    ) -> Result<(), Malformed> {
        out.extend_from_slice(r.take(n, what)?);
        Ok(())
    }
    copy(r, out, 4, "n_kept")?;
    let n = u32::from_le_bytes(out[..4].try_into().unwrap()) as usize;
    if n == 0 || n > header.n_vocab {
        return Err("a kept count read_row refuses".into());
    }
    for (bytes, what) in [(4, "max"), (8, "lse"), (8, "lp_true"), (8, "tail_mass")] {
        copy(r, out, bytes, what)?;
    }
    for _ in 0..n {
        leb(r, out, "entry id")?;
    }
    for _ in 0..n {
        copy(r, out, 4, "entry logit")?;
    }
    if n < header.n_vocab {
        for (bytes, what) in [(4, "tail hi"), (8, "tail mean logit"), (8, "tail rounding")] {
            copy(r, out, bytes, what)?;
        }
        for _ in 0..LEVELS {
            copy(r, out, 4, "tail level mass")?;
        }
        for _ in 0..LEVELS {
            leb(r, out, "tail level count")?;
        }
        let at = out.len();
        copy(r, out, 4, "tail code length")?;
        let len = u32::from_le_bytes(out[at..].try_into().unwrap()) as usize;
        copy(r, out, len, "tail code")?;
    }
    Ok(())
}

/// A row's tail levels in vocabulary order (kept ids skipped), rANS coded
/// with the row's own level counts as the model (stored before the code).
fn code_levels(t: &crate::measure::kld::Tail) -> Vec<u8> {
    let levels: Vec<u8> = t.codes.iter().copied().filter(|&c| c != KEPT).collect();
    let (f, c) = rans::frequencies(&t.counts[..LEVELS]).expect("a tail has ids");
    rans::encode(&levels, (&f, &c))
}

/// The levels [`code_levels`] coded, for a row with level `counts` whose
/// kept ids are marked in `kept`; None unless they decode exactly (the
/// code's end state, its every byte) to levels with those counts.
fn decode_levels(coded: &[u8], counts: &[u32], kept: &[bool]) -> Option<Vec<u8>> {
    let n = kept.iter().filter(|k| !**k).count();
    if counts.iter().map(|&c| c as usize).sum::<usize>() != n {
        return None;
    }
    let (f, c) = rans::frequencies(counts)?;
    let levels = rans::decode(coded, n, (&f, &c))?;
    let mut got = vec![0u32; LEVELS];
    for &l in &levels {
        got[l as usize] += 1;
    }
    if got != counts {
        return None;
    }
    let mut it = levels.into_iter();
    kept.iter()
        .map(|&k| if k { Some(KEPT) } else { it.next() })
        .collect()
}

/// `v` as unsigned LEB128.
fn leb128(out: &mut Vec<u8>, mut v: u32) {
    loop {
        let b = (v & 0x7F) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

mod llama;
pub(crate) use llama::import_llama_kld;

#[cfg(test)]
mod tests;
