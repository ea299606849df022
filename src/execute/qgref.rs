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

use crate::core::auth::Seal;
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

    /// One record's bytes, read at offset `base` of its file; `past_end`
    /// is the file's error where the record was cut short.
    fn record(b: &'a [u8], base: usize, past_end: Option<Malformed>) -> Self {
        Reader {
            b,
            at: 0,
            base,
            past_end,
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
mod stream;
pub(crate) use llama::import_llama_kld;
pub(crate) use stream::{RowStream, RowWriter};

#[cfg(test)]
mod tests;
