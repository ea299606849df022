//! Reference distributions on disk: quantgate's compact reference cache,
//! and llama-perplexity's `--kl-divergence-base` files as an import.
//!
//! Cache layout (little-endian): `QGKLDREF`, u32 version, u32 header
//! length, the header as JSON, then per position u32 n_kept, f32 max,
//! f64 lse, f64 lp_true, f64 tail_mass, n_kept × (u32 id, f32 logit), and
//! when n_kept < n_vocab the tail: f32 lo, f32 hi, f64 Σ p·(l − max),
//! f64 Σ (p̃ − p)·(l − max), n_vocab level bytes
//! (255 = kept); finally the sha256 of everything before it. Reading
//! checks every byte: magic, version, header equal to what the case
//! expects, record bounds, exact length, trailing hash, finite values.
//!
//! Contract: a file that fails any check is an error naming the file and
//! the offset or field, never a partial result.

use crate::core::fsutil::{seal, sha256_bytes, unseal};
use crate::execute::windows::ScoringPlan;
use crate::measure::kld::RefPosition;
use serde::{Deserialize, Serialize};

const MAGIC: &[u8; 8] = b"QGKLDREF";
const VERSION: u32 = 1;

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
    pub fn key(&self) -> String {
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

/// Serialize a cache.
pub fn encode(header: &CacheHeader, rows: &[RefPosition]) -> Vec<u8> {
    let h = serde_json::to_vec(header).expect("a header serializes");
    let entries: usize = rows.iter().map(|r| r.entries.len()).sum();
    let tails: usize = rows
        .iter()
        .filter_map(|r| r.tail.as_ref())
        .map(|t| 8 + t.codes.len())
        .sum();
    let mut out = Vec::with_capacity(16 + h.len() + rows.len() * 32 + entries * 8 + tails + 32);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(h.len() as u32).to_le_bytes());
    out.extend_from_slice(&h);
    for r in rows {
        out.extend_from_slice(&(r.entries.len() as u32).to_le_bytes());
        out.extend_from_slice(&r.max.to_le_bytes());
        out.extend_from_slice(&r.lse.to_le_bytes());
        out.extend_from_slice(&r.lp_true.to_le_bytes());
        out.extend_from_slice(&r.tail_mass.to_le_bytes());
        for &(id, l) in &r.entries {
            out.extend_from_slice(&id.to_le_bytes());
            out.extend_from_slice(&l.to_le_bytes());
        }
        if let Some(t) = &r.tail {
            out.extend_from_slice(&t.lo.to_le_bytes());
            out.extend_from_slice(&t.hi.to_le_bytes());
            out.extend_from_slice(&t.mean_logit.to_le_bytes());
            out.extend_from_slice(&t.rounding.to_le_bytes());
            out.extend_from_slice(&t.codes);
        }
    }
    seal(out)
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize, what: &str) -> Result<&[u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| {
                format!(
                    "offset {}: truncated: {what} needs {n} bytes, {} left",
                    self.at,
                    self.b.len() - self.at
                )
            })?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u32(&mut self, what: &str) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().unwrap()))
    }
    fn i32(&mut self, what: &str) -> Result<i32, String> {
        Ok(i32::from_le_bytes(self.take(4, what)?.try_into().unwrap()))
    }
    fn f32(&mut self, what: &str) -> Result<f32, String> {
        Ok(f32::from_le_bytes(self.take(4, what)?.try_into().unwrap()))
    }
    fn f64(&mut self, what: &str) -> Result<f64, String> {
        Ok(f64::from_le_bytes(self.take(8, what)?.try_into().unwrap()))
    }
}

/// Read a cache and check it against `expect` (all fields but the
/// tokenizer fingerprint, which is returned for the caller to compare).
pub fn decode(
    bytes: &[u8],
    expect: &CacheHeader,
) -> Result<(CacheHeader, Vec<RefPosition>), String> {
    if bytes.len() < 8 + 32 || &bytes[..8] != MAGIC {
        return Err("not a quantgate reference cache (magic `QGKLDREF` missing)".into());
    }
    let body = unseal(bytes)?;
    let mut r = Reader { b: body, at: 8 };
    let version = r.u32("version")?;
    if version != VERSION {
        return Err(format!("version {version}, this build reads {VERSION}"));
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
        ));
    }
    let mut rows = Vec::with_capacity(header.positions);
    for p in 0..header.positions {
        let start = r.at;
        let bad = |what: &str| format!("offset {start}: position {p}: {what}");
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
        if !max.is_finite()
            || !lse.is_finite()
            || lse < 0.0
            || !lp_true.is_finite()
            || lp_true > 0.0
        {
            return Err(bad("non-finite or impossible max/lse/lp_true"));
        }
        if !(0.0..=1.0).contains(&tail_mass) {
            return Err(bad("tail mass outside [0, 1]"));
        }
        let raw = r.take(n * 8, "entries")?;
        let mut entries = Vec::with_capacity(n);
        for c in raw.chunks_exact(8) {
            let id = u32::from_le_bytes(c[..4].try_into().unwrap());
            let l = f32::from_le_bytes(c[4..].try_into().unwrap());
            if id as usize >= header.n_vocab || !l.is_finite() || l > max {
                return Err(bad(&format!("entry id {id} logit {l} is invalid")));
            }
            entries.push((id, l));
        }
        let tail = if n < header.n_vocab {
            let lo = r.f32("tail lo")?;
            let hi = r.f32("tail hi")?;
            let mean_logit = r.f64("tail mean logit")?;
            let rounding = r.f64("tail rounding")?;
            let codes = r.take(header.n_vocab, "tail levels")?.to_vec();
            if !lo.is_finite()
                || !hi.is_finite()
                || lo > hi
                || hi > max
                || !mean_logit.is_finite()
                || !rounding.is_finite()
            {
                return Err(bad(&format!("tail range {lo}..{hi} is invalid")));
            }
            let kept = codes
                .iter()
                .filter(|&&c| c == crate::measure::kld::KEPT)
                .count();
            if kept != n
                || entries
                    .iter()
                    .any(|&(id, _)| codes[id as usize] != crate::measure::kld::KEPT)
            {
                return Err(bad("tail levels disagree with the kept entries"));
            }
            if tail_mass <= 0.0 {
                return Err(bad("a tail with zero mass"));
            }
            Some(crate::measure::kld::Tail::new(
                lo, hi, mean_logit, rounding, codes,
            ))
        } else {
            None
        };
        rows.push(RefPosition {
            max,
            lse,
            entries,
            lp_true,
            tail_mass,
            tail,
            approximate: false,
        });
    }
    if r.at != body.len() {
        return Err(format!(
            "offset {}: {} trailing bytes after {} positions",
            r.at,
            body.len() - r.at,
            header.positions
        ));
    }
    Ok((header, rows))
}

/// Import a llama-perplexity `--kl-divergence-base` file for a case's plan
/// (llama-perplexity windowing): checks the exact length, the dimensions
/// against the case and the candidate, the token stream against the case's,
/// and finite scale/min in every row. Rows keep the entries llama.cpp's KLD
/// sums (log-prob > −16), as f32 values exactly as it decodes them.
pub fn import_llama_kld(
    bytes: &[u8],
    plan: &ScoringPlan,
    n_ctx: u32,
    n_vocab_cand: usize,
) -> Result<Vec<RefPosition>, String> {
    if bytes.len() < 8 || &bytes[..8] != b"_logits_" {
        return Err(
            "offset 0: not a llama-perplexity KL-divergence base file (magic `_logits_` missing)"
                .into(),
        );
    }
    let mut r = Reader { b: bytes, at: 8 };
    let f_ctx = r.u32("n_ctx")?;
    let f_vocab = r.i32("n_vocab")?;
    let f_chunk = r.i32("n_chunk")?;
    if f_vocab <= 0 || f_chunk <= 0 || f_ctx < 4 {
        return Err(format!(
            "offset 12: impossible dimensions n_ctx {f_ctx}, n_vocab {f_vocab}, n_chunk {f_chunk}"
        ));
    }
    let (n_vocab, n_chunk, n_ctx_f) = (f_vocab as usize, f_chunk as usize, f_ctx as usize);
    let per_chunk = n_ctx_f - 1 - n_ctx_f / 2;
    let nv = 2 * n_vocab.div_ceil(2) + 4;
    let expected_len = n_ctx_f
        .checked_mul(n_chunk)
        .and_then(|t| t.checked_mul(4))
        .and_then(|t| {
            per_chunk
                .checked_mul(n_chunk)?
                .checked_mul(nv)?
                .checked_mul(2)?
                .checked_add(t)
        })
        .and_then(|t| t.checked_add(20))
        .ok_or("dimensions overflow")?;
    if bytes.len() != expected_len {
        return Err(format!(
            "{} bytes, but n_ctx {f_ctx}, n_vocab {f_vocab}, n_chunk {f_chunk} make {expected_len}: {}",
            bytes.len(),
            if bytes.len() < expected_len {
                "truncated"
            } else {
                "trailing bytes"
            }
        ));
    }
    if f_ctx != n_ctx {
        return Err(format!(
            "offset 8: n_ctx {f_ctx}, the case's window.n_ctx is {n_ctx}"
        ));
    }
    if n_vocab != n_vocab_cand {
        return Err(format!(
            "offset 12: n_vocab {n_vocab}, the candidate's vocabulary has {n_vocab_cand}"
        ));
    }
    if n_chunk != plan.windows.len() {
        return Err(format!(
            "offset 16: n_chunk {n_chunk}, the case scores {} chunks",
            plan.windows.len()
        ));
    }
    let mut tokens = Vec::with_capacity(n_ctx_f * n_chunk);
    for _ in 0..n_ctx_f * n_chunk {
        tokens.push(r.i32("tokens")?);
    }
    for (w, pw) in plan.windows.iter().enumerate() {
        let file = &tokens[w * n_ctx_f..(w + 1) * n_ctx_f];
        // Position 0 is replaced by BOS in the pass; compare the rest.
        if let Some(i) = (1..n_ctx_f).find(|&i| file[i] != pw.window.tokens[i]) {
            return Err(format!(
                "offset {}: token stream differs from the case's: chunk {w}, position {i}: file {} vs case {}",
                20 + 4 * (w * n_ctx_f + i),
                file[i],
                pw.window.tokens[i]
            ));
        }
        if pw.first_scored != n_ctx_f / 2 || pw.targets.len() != per_chunk {
            return Err("the case's windows are not llama-perplexity's default windows".into());
        }
    }
    let mut rows = Vec::with_capacity(per_chunk * n_chunk);
    for (w, pw) in plan.windows.iter().enumerate() {
        for (k, &target) in pw.targets.iter().enumerate() {
            let at = r.at;
            let rec = r.take(nv * 2, "record")?;
            let scale = f32::from_le_bytes(rec[0..4].try_into().unwrap());
            let min_lp = f32::from_le_bytes(rec[4..8].try_into().unwrap());
            if !scale.is_finite() || !min_lp.is_finite() || scale < 0.0 {
                return Err(format!(
                    "offset {at}: chunk {w}, scored position {k}: scale {scale}, min_log_prob {min_lp} (must be finite, scale ≥ 0)"
                ));
            }
            let us = &rec[8..];
            let lp = |j: usize| -> f32 {
                let u = u16::from_le_bytes([us[2 * j], us[2 * j + 1]]);
                scale * f32::from(u) + min_lp
            };
            let mut entries: Vec<(u32, f32)> = (0..n_vocab)
                .map(|j| (j as u32, lp(j)))
                .filter(|&(_, v)| v > -16.0)
                .collect();
            if entries.is_empty() {
                return Err(format!(
                    "offset {at}: chunk {w}, scored position {k}: no entry above the −16 floor"
                ));
            }
            entries.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            rows.push(RefPosition {
                max: 0.0,
                lse: 0.0,
                lp_true: f64::from(lp(target as usize)),
                entries,
                tail_mass: 0.0,
                tail: None,
                approximate: true,
            });
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::row_stats;

    fn header() -> CacheHeader {
        CacheHeader {
            reference_sha256: "a".repeat(64),
            token_stream_sha256: "b".repeat(64),
            windowing: "llama-perplexity n_ctx=8".into(),
            settings: "s".into(),
            build: "b".into(),
            tail: 1e-6,
            max_kept: 4,
            positions: 3,
            n_vocab: 10,
            tokenizer_fingerprint: "fp".into(),
        }
    }

    fn rows() -> Vec<RefPosition> {
        (0..3)
            .map(|i| {
                let row: Vec<f32> = (0..10).map(|j| ((j * 7 + i * 3) % 11) as f32).collect();
                crate::measure::kld::compress_row(&row, &row_stats(&row), 2, 1e-6, 4)
            })
            .collect()
    }

    #[test]
    fn a_cache_round_trips_and_every_corruption_is_caught() {
        let h = header();
        let bytes = encode(&h, &rows());
        let (back, r) = decode(&bytes, &h).unwrap();
        assert_eq!(back, h);
        assert_eq!(r, rows());
        // Any single flipped byte, any truncation, any trailing byte.
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x40;
            assert!(decode(&b, &h).is_err(), "flip at {i} accepted");
        }
        for n in 0..bytes.len() {
            assert!(
                decode(&bytes[..n], &h).is_err(),
                "truncation to {n} accepted"
            );
        }
        let mut b = bytes.clone();
        b.push(0);
        assert!(decode(&b, &h).is_err());
        // Another case's header: refused, naming the difference.
        let mut other = h.clone();
        other.token_stream_sha256 = "c".repeat(64);
        let e = decode(&bytes, &other).unwrap_err();
        assert!(e.contains("header does not match"), "{e}");
    }
}
