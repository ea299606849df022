//! llama-perplexity's `--kl-divergence-base` files as streams: written
//! from the linked engine's logits exactly as the tool writes them, and
//! read back a row at a time (a file holds n_vocab u16 per scored
//! position: hundreds of megabytes at SmolLM2's vocabulary, gigabytes at
//! Gemma's, so nothing here holds more than one row).
//!
//! Layout (the tool's, `tools/perplexity/perplexity.cpp`): `_logits_`,
//! n_ctx (i32), n_vocab (i32), n_chunk (i32), the n_chunk·n_ctx input
//! tokens (i32), then per chunk its n_ctx − 1 − n_ctx/2 scored positions,
//! each `nv = 2·⌈n_vocab/2⌉ + 4` u16: the scale and the minimum log-prob
//! (two f32), then one u16 per vocabulary entry, then padding. All
//! little-endian.
//!
//! Contract: a file is believed only when its length is exactly what its
//! dimensions make and its every row has a finite scale ≥ 0 and a finite
//! minimum; an error names the offset.

use crate::core::error::Malformed;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;

/// The file's head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// Window length.
    pub n_ctx: usize,
    /// Vocabulary size.
    pub n_vocab: usize,
    /// Chunks (windows).
    pub n_chunk: usize,
    /// The input tokens, n_ctx per chunk.
    pub tokens: Vec<i32>,
}

impl Head {
    /// u16 per row.
    pub(crate) fn nv(&self) -> usize {
        2 * self.n_vocab.div_ceil(2) + 4
    }

    /// Scored positions per chunk.
    pub(crate) fn per_chunk(&self) -> usize {
        self.n_ctx - 1 - self.n_ctx / 2
    }

    /// The file's length in bytes.
    fn len(&self) -> Option<u64> {
        let rows = self.per_chunk().checked_mul(self.n_chunk)?;
        let row_bytes = self.nv().checked_mul(2)?;
        let tokens = self.n_ctx.checked_mul(self.n_chunk)?.checked_mul(4)?;
        (20usize)
            .checked_add(tokens)?
            .checked_add(rows.checked_mul(row_bytes)?)
            .map(|n| n as u64)
    }
}

/// One decoded row: scale, minimum log-prob, and the entries (padding
/// dropped).
#[derive(Debug, Clone, PartialEq)]
pub struct OwnedRow {
    /// Log-prob step.
    pub scale: f32,
    /// Log-prob of a 0.
    pub min: f32,
    /// One value per vocabulary entry.
    pub q: Vec<u16>,
}

impl OwnedRow {
    /// As the drift measure reads it.
    pub(crate) fn view(&self) -> crate::measure::drift::Row<'_> {
        crate::measure::drift::Row {
            scale: self.scale,
            min: self.min,
            q: &self.q,
        }
    }
}

/// A base file read a row at a time (from a file, or from bytes already
/// read and verified: a case's pinned `[reference_kld]`).
pub struct Reader<R: Read = BufReader<std::fs::File>> {
    file: R,
    /// Its head.
    pub head: Head,
    /// Bytes read so far (for offsets in errors).
    at: u64,
    rows_left: usize,
    buf: Vec<u8>,
}

impl Reader {
    /// Open `path`: its head read and checked, and its length against it.
    pub fn open(path: &Path) -> Result<Reader, Malformed> {
        let f = std::fs::File::open(path).map_err(|e| format!("{e}"))?;
        let size = f.metadata().map_err(|e| format!("{e}"))?.len();
        Reader::new(BufReader::with_capacity(1 << 20, f), size)
    }
}

impl<R: Read> Reader<R> {
    /// The base file `file` of `size` bytes: its head read and checked,
    /// and its length against it.
    pub(crate) fn new(mut file: R, size: u64) -> Result<Reader<R>, Malformed> {
        let mut magic = [0u8; 8];
        file.read_exact(&mut magic)
            .map_err(|_| "offset 0: shorter than a head".to_string())?;
        if &magic != b"_logits_" {
            return Err(
                "offset 0: not a llama-perplexity KL-divergence base file (magic `_logits_` missing)"
                    .into(),
            );
        }
        let mut i32_at = |what: &str, at: u64| -> Result<i32, Malformed> {
            let mut b = [0u8; 4];
            file.read_exact(&mut b)
                .map_err(|_| format!("offset {at}: {what}: the file ends"))?;
            Ok(i32::from_le_bytes(b))
        };
        let (c, v, k) = (
            i32_at("n_ctx", 8)?,
            i32_at("n_vocab", 12)?,
            i32_at("n_chunk", 16)?,
        );
        if c < 4 || v <= 0 || k <= 0 {
            return Err(format!(
                "offset 8: impossible dimensions n_ctx {c}, n_vocab {v}, n_chunk {k}"
            )
            .into());
        }
        let mut head = Head {
            n_ctx: c as usize,
            n_vocab: v as usize,
            n_chunk: k as usize,
            tokens: Vec::new(),
        };
        let want = head.len().ok_or("dimensions overflow")?;
        if size != want {
            return Err(format!(
                "{size} bytes, but n_ctx {c}, n_vocab {v}, n_chunk {k} make {want}: {}",
                if size < want {
                    "truncated"
                } else {
                    "trailing bytes"
                }
            )
            .into());
        }
        let mut tb = vec![0u8; head.n_ctx * head.n_chunk * 4];
        file.read_exact(&mut tb)
            .map_err(|e| format!("offset 20: tokens: {e}"))?;
        head.tokens = tb
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect();
        let rows_left = head.per_chunk() * head.n_chunk;
        let buf = vec![0u8; head.nv() * 2];
        Ok(Reader {
            file,
            at: 20 + tb.len() as u64,
            head,
            rows_left,
            buf,
        })
    }

    /// Where the next row starts (for offsets in errors).
    pub(crate) fn offset(&self) -> u64 {
        self.at
    }

    /// The next row, or None after the last; a row with a scale or minimum
    /// that is not finite (or a negative scale) is an error naming its
    /// offset.
    pub fn next_row(&mut self, into: &mut OwnedRow) -> Result<bool, Malformed> {
        if self.rows_left == 0 {
            return Ok(false);
        }
        let at = self.at;
        self.file
            .read_exact(&mut self.buf)
            .map_err(|e| format!("offset {at}: {e}"))?;
        self.at += self.buf.len() as u64;
        self.rows_left -= 1;
        let f = |o: usize| f32::from_le_bytes(self.buf[o..o + 4].try_into().expect("4 bytes"));
        let (scale, min) = (f(0), f(4));
        if !scale.is_finite() || !min.is_finite() || scale < 0.0 {
            return Err(format!(
                "offset {at}: scale {scale}, min_log_prob {min} (must be finite, scale ≥ 0)"
            )
            .into());
        }
        into.scale = scale;
        into.min = min;
        into.q.clear();
        into.q.extend(
            self.buf[8..8 + 2 * self.head.n_vocab]
                .chunks_exact(2)
                .map(|b| u16::from_le_bytes([b[0], b[1]])),
        );
        Ok(true)
    }
}

/// llama-perplexity's rounding (`nearest_int`): x + 1.5·2^23, its low
/// mantissa bits less 2^22.
fn nearest_int(x: f32) -> i32 {
    let v = x + 12_582_912.0f32;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// One row from a position's logits, exactly as llama-perplexity's
/// `log_softmax(n_vocab, logits, log_prob, tok)` writes it: the maximum
/// and the minimum (at most 16 below the maximum) in f32, Σ exp in f64 of
/// f32 `exp`, the scale and the minimum log-prob in f32, each entry above
/// the minimum rounded by `nearest_int`.
pub(crate) fn encode(logits: &[f32], out: &mut OwnedRow) {
    let mut max = logits[0];
    let mut min = logits[0];
    for &l in &logits[1..] {
        max = max.max(l);
        min = min.min(l);
    }
    min = min.max(max - 16.0);
    let mut sum_exp = 0.0f64;
    for &l in logits {
        sum_exp += f64::from((l - max).exp());
    }
    let log_sum_exp = sum_exp.ln() as f32;
    out.min = min - max - log_sum_exp;
    out.scale = (max - min) / 65535.0;
    out.q.clear();
    if out.scale != 0.0 {
        let inv = 1.0 / out.scale;
        out.q.extend(logits.iter().map(|&l| {
            if l > min {
                nearest_int(inv * (l - min)) as u16
            } else {
                0
            }
        }));
    } else {
        out.q.resize(logits.len(), 0);
    }
}

/// A base file written a row at a time, in the tool's layout.
pub struct Writer {
    file: BufWriter<std::fs::File>,
    nv: usize,
    rows_left: usize,
}

impl Writer {
    /// Start `path` with `head` (its tokens n_ctx per chunk).
    pub fn create(path: &Path, head: &Head) -> std::io::Result<Writer> {
        assert_eq!(head.tokens.len(), head.n_ctx * head.n_chunk);
        let mut file = BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
        file.write_all(b"_logits_")?;
        for v in [head.n_ctx, head.n_vocab, head.n_chunk] {
            file.write_all(&(v as i32).to_le_bytes())?;
        }
        for t in &head.tokens {
            file.write_all(&t.to_le_bytes())?;
        }
        Ok(Writer {
            file,
            nv: head.nv(),
            rows_left: head.per_chunk() * head.n_chunk,
        })
    }

    /// The next row.
    pub fn row(&mut self, r: &OwnedRow) -> std::io::Result<()> {
        if self.rows_left == 0 {
            return Err(std::io::Error::other("more rows than the head declares"));
        }
        self.rows_left -= 1;
        let mut b = Vec::with_capacity(self.nv * 2);
        b.extend_from_slice(&r.scale.to_le_bytes());
        b.extend_from_slice(&r.min.to_le_bytes());
        for q in &r.q {
            b.extend_from_slice(&q.to_le_bytes());
        }
        b.resize(self.nv * 2, 0);
        self.file.write_all(&b)
    }

    /// Every row written: flushed and closed.
    pub fn finish(mut self) -> std::io::Result<()> {
        if self.rows_left != 0 {
            return Err(std::io::Error::other(format!(
                "{} rows short of the head",
                self.rows_left
            )));
        }
        self.file.flush()?;
        self.file.get_ref().sync_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file written row by row reads back the same, and its length is
    /// checked: one byte more or less is refused naming the cause.
    #[test]
    fn a_base_file_round_trips_and_its_length_is_checked() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("b.kld");
        let head = Head {
            n_ctx: 8,
            n_vocab: 5,
            n_chunk: 2,
            tokens: (0..16).collect(),
        };
        let mut w = Writer::create(&p, &head).unwrap();
        let mut rows = Vec::new();
        for k in 0..head.per_chunk() * 2 {
            let logits: Vec<f32> = (0..5).map(|i| (i as f32 - k as f32).sin() * 4.0).collect();
            let mut r = OwnedRow {
                scale: 0.0,
                min: 0.0,
                q: Vec::new(),
            };
            encode(&logits, &mut r);
            w.row(&r).unwrap();
            rows.push(r);
        }
        w.finish().unwrap();
        let mut r = Reader::open(&p).unwrap();
        assert_eq!(r.head, head);
        let mut got = OwnedRow {
            scale: 0.0,
            min: 0.0,
            q: Vec::new(),
        };
        for want in &rows {
            assert!(r.next_row(&mut got).unwrap());
            assert_eq!(&got, want);
        }
        assert!(!r.next_row(&mut got).unwrap());
        // The top entry decodes to about its log-softmax.
        let bytes = std::fs::read(&p).unwrap();
        std::fs::write(&p, &bytes[..bytes.len() - 1]).unwrap();
        assert!(Reader::open(&p).err().unwrap().0.contains("truncated"));
        let mut more = bytes.clone();
        more.push(0);
        std::fs::write(&p, &more).unwrap();
        assert!(Reader::open(&p).err().unwrap().0.contains("trailing"));
    }

    /// The encoding is the tool's: the maximum at 65535, entries more than
    /// 16 below it at 0, the log-prob of an entry within one step of its
    /// log-softmax, and `nearest_int` rounds half to even.
    #[test]
    fn a_row_is_encoded_as_llama_perplexity_encodes_it() {
        assert_eq!(
            (nearest_int(2.5), nearest_int(3.5), nearest_int(1.4)),
            (2, 4, 1)
        );
        let logits = [3.0f32, 1.0, -20.0, 2.5];
        let mut r = OwnedRow {
            scale: 0.0,
            min: 0.0,
            q: Vec::new(),
        };
        encode(&logits, &mut r);
        assert_eq!(r.q[0], 65535);
        assert_eq!(r.q[2], 0);
        let lse = logits.iter().map(|l| f64::from(*l).exp()).sum::<f64>().ln();
        for (i, &l) in logits.iter().enumerate().filter(|(i, _)| *i != 2) {
            let lp = f64::from(r.scale) * f64::from(r.q[i]) + f64::from(r.min);
            assert!(
                (lp - (f64::from(l) - lse)).abs() <= f64::from(r.scale),
                "{i}"
            );
        }
    }
}
