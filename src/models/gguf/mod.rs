//! Bounded preflight of a GGUF header, in Rust, before llama.cpp sees the file.
//!
//! Contract: reads at most the header; every count and length is checked
//! against the bytes left in the file with checked arithmetic, so a hostile
//! header (absurd counts, huge strings, an HTML page or a git-lfs pointer saved
//! as `.gguf`) is an `Error` naming the file and byte position, never a panic
//! or an allocation of attacker-chosen size.

use crate::core::error::{Error, Malformed, Result};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

/// What the header says.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufHeader {
    /// Format version (2 or 3).
    pub version: u32,
    /// Number of tensors.
    pub n_tensors: u64,
    /// Number of metadata key/value pairs.
    pub n_kv: u64,
    /// `general.architecture`, when present.
    pub architecture: Option<String>,
    /// Where the last tensor's data ends (for a well-formed file whose
    /// tensor types all have a known size: the file's length).
    pub data_end: u64,
    /// sha256 over every `tokenizer.*` metadata entry but the chat template
    /// (key, type and value bytes, in file order): the whole tokenizer
    /// definition — vocabulary, merges, scores, types, special ids, pre-
    /// tokenizer. Equal hashes, one tokenization (by one llama.cpp build).
    pub tokenizer_sha256: String,
    /// Per tensor type (ggml's name, `typeNN` for one it does not know):
    /// tensors, elements, bytes (None when ggml does not know the type's size).
    pub types: BTreeMap<String, TypeTotal>,
    /// Elements of every tensor: the parameter count llama.cpp reports.
    pub n_params: u64,
    /// Scalar and string metadata outside `tokenizer.*` (strings over 4 KiB
    /// kept as their length only), and the length of each array.
    pub meta: BTreeMap<String, Meta>,
    /// `tokenizer.ggml.tokens`' length: the vocabulary size.
    pub n_vocab: Option<u64>,
    /// Whether `tokenizer.chat_template` is present.
    pub chat_template: bool,
}

/// One tensor type's share of a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeTotal {
    /// Tensors of the type.
    pub tensors: u64,
    /// Their elements (parameters).
    pub elements: u64,
    /// Their data bytes, when ggml knows the type's block size.
    pub bytes: Option<u64>,
}

impl Default for TypeTotal {
    /// No tensor: no elements and (known to be) no bytes.
    fn default() -> Self {
        TypeTotal {
            tensors: 0,
            elements: 0,
            bytes: Some(0),
        }
    }
}

impl TypeTotal {
    /// Add `other`'s tensors to these (bytes unknown once either's are).
    pub(crate) fn add(&mut self, other: &TypeTotal) {
        self.tensors += other.tensors;
        self.elements = self.elements.saturating_add(other.elements);
        self.bytes = self
            .bytes
            .zip(other.bytes)
            .map(|(a, b)| a.saturating_add(b));
    }
}

/// A metadata value, as far as `inspect` shows it.
#[derive(Debug, Clone, PartialEq)]
pub enum Meta {
    /// An integer or bool (GGUF types 0–7, 10, 11).
    Int(i128),
    /// A float (types 6, 12).
    Float(f64),
    /// A string of at most 4 KiB.
    Str(String),
    /// A longer string: its byte length.
    LongStr(u64),
    /// An array: its length.
    Array(u64),
}

impl std::fmt::Display for Meta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Meta::Int(v) => write!(f, "{v}"),
            Meta::Float(v) => write!(f, "{v}"),
            Meta::Str(v) => write!(f, "{v}"),
            Meta::LongStr(n) => write!(f, "({n}-byte string)"),
            Meta::Array(n) => write!(f, "({n}-element array)"),
        }
    }
}

/// ggml type id → (elements per block, bytes per block), from ggml itself;
/// None for an id ggml does not know (the data range of such a tensor is
/// then checked for its first byte only).
pub(crate) fn ggml_type_size(id: u32) -> Option<(u64, u64)> {
    crate::engine::llama::ggml_type(id).map(|t| (t.block, t.bytes))
}

/// ggml type id → ggml's name for it (`typeNN` for an id it does not know).
pub(crate) fn ggml_type_name(id: u32) -> String {
    crate::engine::llama::ggml_type(id).map_or_else(|| format!("type{id}"), |t| t.name)
}

struct Reader<R> {
    inner: R,
    pos: u64,
    len: u64,
    /// While set, every byte read or skipped is hashed into it.
    hash: Option<sha2::Sha256>,
}

/// A writer that hashes what it is given (skipped bytes under a hash).
struct HashSink<'a>(&'a mut sha2::Sha256);

impl std::io::Write for HashSink<'_> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        sha2::Digest::update(self.0, b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<R: Read> Reader<R> {
    fn left(&self) -> u64 {
        self.len.saturating_sub(self.pos)
    }

    fn bytes(&mut self, n: u64, what: &str) -> std::result::Result<Vec<u8>, Malformed> {
        if n > self.left() {
            return Err(format!(
                "{what} needs {n} bytes at offset {}, but only {} are left in the file",
                self.pos,
                self.left()
            )
            .into());
        }
        let n_usize = usize::try_from(n).map_err(|_| format!("{what}: length {n} too large"))?;
        let mut buf = vec![0u8; n_usize];
        self.inner
            .read_exact(&mut buf)
            .map_err(|e| format!("{what} at offset {}: {e}", self.pos))?;
        if let Some(h) = &mut self.hash {
            sha2::Digest::update(h, &buf);
        }
        self.pos += n;
        Ok(buf)
    }

    fn skip(&mut self, n: u64, what: &str) -> std::result::Result<(), Malformed> {
        if n > self.left() {
            return Err(format!(
                "{what} needs {n} bytes at offset {}, but only {} are left in the file",
                self.pos,
                self.left()
            )
            .into());
        }
        let mut src = (&mut self.inner).take(n);
        let copied = match &mut self.hash {
            Some(h) => std::io::copy(&mut src, &mut HashSink(h)),
            None => std::io::copy(&mut src, &mut std::io::sink()),
        }
        .map_err(|e| format!("{what} at offset {}: {e}", self.pos))?;
        if copied != n {
            return Err(format!("{what} at offset {}: file ended early", self.pos).into());
        }
        self.pos += n;
        Ok(())
    }

    fn u32(&mut self, what: &str) -> std::result::Result<u32, Malformed> {
        let b = self.bytes(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self, what: &str) -> std::result::Result<u64, Malformed> {
        let b = self.bytes(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(&b);
        Ok(u64::from_le_bytes(a))
    }

    fn string(&mut self, what: &str) -> std::result::Result<Vec<u8>, Malformed> {
        let at = self.pos;
        let n = self.u64(what)?;
        if n > self.left() {
            return Err(format!(
                "{what} at offset {at} claims {n} bytes, but only {} are left in the file",
                self.left()
            )
            .into());
        }
        self.bytes(n, what)
    }

    fn skip_string(&mut self, what: &str) -> std::result::Result<(), Malformed> {
        let n = self.u64(what)?;
        self.skip(n, what)
    }
}

/// Size in bytes of a fixed-size GGUF value type, or None for string/array.
fn scalar_size(t: u32) -> Option<u64> {
    match t {
        0 | 1 | 7 => Some(1), // u8, i8, bool
        2 | 3 => Some(2),     // u16, i16
        4..=6 => Some(4),     // u32, i32, f32
        10..=12 => Some(8),   // u64, i64, f64
        _ => None,
    }
}

/// Check the header of `path` (its structure and the hyperparameters
/// llama.cpp asserts on); return what it says.
pub fn preflight(path: &Path) -> Result<GgufHeader> {
    let h = header_structure(path)?;
    hyperparameters(&h.meta, h.architecture.as_deref())
        .map_err(|m| Error::input(format!("{}: not a usable GGUF file: {m}", path.display())))?;
    Ok(h)
}

/// Check the structure of `path`'s header (magic, version, bounded counts,
/// every tensor within the file), not what its values say.
pub(crate) fn header_structure(path: &Path) -> Result<GgufHeader> {
    let file = File::open(path).map_err(|e| Error::input(format!("{}: {e}", path.display())))?;
    let len = file
        .metadata()
        .map_err(|e| Error::input(format!("{}: {e}", path.display())))?
        .len();
    let mut r = Reader {
        inner: BufReader::with_capacity(1 << 16, file),
        pos: 0,
        len,
        hash: None,
    };
    parse(&mut r)
        .map_err(|m| Error::input(format!("{}: not a usable GGUF file: {m}", path.display())))
}

/// Parse a header from bytes in memory (the unit tests' way in).
#[cfg(test)]
pub(crate) fn preflight_bytes(bytes: &[u8]) -> std::result::Result<GgufHeader, Malformed> {
    let mut r = Reader {
        inner: bytes,
        pos: 0,
        len: bytes.len() as u64,
        hash: None,
    };
    let h = parse(&mut r)?;
    hyperparameters(&h.meta, h.architecture.as_deref())?;
    Ok(h)
}

fn parse<R: Read>(r: &mut Reader<R>) -> std::result::Result<GgufHeader, Malformed> {
    let magic = r
        .bytes(4, "magic")
        .map_err(|_| format!("file is {} bytes, too short for a GGUF header", r.len))?;
    if magic != b"GGUF" {
        let hint = if magic.starts_with(b"<") {
            " (it looks like an HTML or XML page)"
        } else if magic == b"vers" {
            " (it looks like a git-lfs pointer: run `git lfs pull`)"
        } else {
            ""
        };
        return Err(format!(
            "bad magic {:?} at offset 0, expected \"GGUF\"{hint}",
            String::from_utf8_lossy(&magic)
        )
        .into());
    }
    let version = r.u32("version")?;
    if version != 2 && version != 3 {
        return Err(
            format!("unsupported GGUF version {version} at offset 4 (expected 2 or 3)").into(),
        );
    }
    let n_tensors = r.u64("tensor count")?;
    let n_kv = r.u64("metadata count")?;
    // Each KV needs at least a key length (8), type (4); each tensor info at
    // least a name length (8), n_dims (4), type (4), offset (8).
    let min_kv = n_kv.checked_mul(12).ok_or("metadata count overflows")?;
    let min_t = n_tensors.checked_mul(24).ok_or("tensor count overflows")?;
    if min_kv.checked_add(min_t).is_none_or(|need| need > r.left()) {
        return Err(format!(
            "header claims {n_kv} metadata entries and {n_tensors} tensors, more than the {} bytes left can hold",
            r.left()
        ).into());
    }
    let mut architecture = None;
    let mut alignment: u64 = 32;
    let mut tokenizer = sha2::Sha256::default();
    let mut meta = BTreeMap::new();
    let mut n_vocab = None;
    let mut chat_template = false;
    for i in 0..n_kv {
        let key = r.string(&format!("metadata key #{i}"))?;
        let key = String::from_utf8_lossy(&key).into_owned();
        if key == "tokenizer.chat_template" {
            chat_template = true;
        }
        if key.starts_with("tokenizer.") && key != "tokenizer.chat_template" {
            sha2::Digest::update(&mut tokenizer, (key.len() as u64).to_le_bytes());
            sha2::Digest::update(&mut tokenizer, key.as_bytes());
            r.hash = Some(tokenizer);
            let value = r
                .u32(&format!("type of `{key}`"))
                .and_then(|t| read_value(r, t, &key));
            tokenizer = r.hash.take().expect("set above");
            if let (Meta::Array(n), "tokenizer.ggml.tokens") = (value?, key.as_str()) {
                n_vocab = Some(n);
            }
            continue;
        }
        let t = r.u32(&format!("type of `{key}`"))?;
        let value = read_value(r, t, &key)?;
        match (&value, key.as_str()) {
            (Meta::Str(v), "general.architecture") => architecture = Some(v.clone()),
            (Meta::Int(v), "general.alignment") if t == 4 => {
                alignment = *v as u64;
                if !alignment.is_power_of_two() {
                    return Err(
                        format!("`general.alignment` is {alignment}, not a power of two").into(),
                    );
                }
            }
            _ => {}
        }
        if !key.starts_with("tokenizer.") {
            meta.insert(key, value);
        }
    }
    let mut types: BTreeMap<String, TypeTotal> = BTreeMap::new();
    let mut n_params: u64 = 0;
    // (name, first byte after the data section start, bytes)
    let mut extents: Vec<(String, u64, Option<u64>)> = Vec::new();
    for i in 0..n_tensors {
        let what = format!("name of tensor #{i}");
        let n = r.u64(&what)?;
        // A name is kept for messages only when short: no allocation of a
        // size the file chooses.
        let name = if n <= 256 {
            String::from_utf8_lossy(&r.bytes(n, &what)?).into_owned()
        } else {
            r.skip(n, &what)?;
            format!("({n}-byte name)")
        };
        let n_dims = r.u32(&format!("dimension count of tensor #{i}"))?;
        if n_dims > 8 {
            return Err(
                format!("tensor #{i} claims {n_dims} dimensions (at most 8 are possible)").into(),
            );
        }
        let mut elems: u64 = 1;
        for _ in 0..n_dims {
            let d = r.u64(&format!("dimension of tensor #{i}"))?;
            elems = elems
                .checked_mul(d)
                .ok_or_else(|| format!("tensor #{i}: element count overflows"))?;
        }
        let t = r.u32(&format!("type of tensor #{i}"))?;
        let offset = r.u64(&format!("data offset of tensor #{i}"))?;
        let bytes =
            ggml_type_size(t).and_then(|(block, size)| elems.div_ceil(block).checked_mul(size));
        n_params = n_params.saturating_add(elems);
        types.entry(ggml_type_name(t)).or_default().add(&TypeTotal {
            tensors: 1,
            elements: elems,
            bytes,
        });
        extents.push((name, offset, bytes));
    }
    // Every tensor's data must lie within the file: a file cut short (its
    // true sha256 pinned) is caught here, naming the tensor, not by llama.cpp.
    let data_start = r.pos.div_ceil(alignment).checked_mul(alignment);
    let mut data_end = data_start.unwrap_or(r.len).min(r.len);
    for (i, (name, offset, bytes)) in extents.iter().enumerate() {
        let start = data_start.and_then(|d| d.checked_add(*offset));
        let end = start.and_then(|s| s.checked_add(bytes.unwrap_or(1)));
        if let Some(e) = end.filter(|e| *e <= r.len) {
            data_end = data_end.max(e);
        }
        if end.is_none_or(|e| e > r.len) {
            return Err(format!(
                "tensor #{i} `{name}`: its data ({} bytes at offset {} of the data section) \
                 lies beyond the end of the file ({} bytes): the file is cut short",
                bytes.map_or("?".to_string(), |b| b.to_string()),
                offset,
                r.len
            )
            .into());
        }
    }
    Ok(GgufHeader {
        version,
        n_tensors,
        n_kv,
        architecture,
        data_end,
        tokenizer_sha256: crate::core::fsutil::hex(&sha2::Digest::finalize(tokenizer)),
        types,
        n_params,
        meta,
        n_vocab,
        chat_template,
    })
}

/// A part of a split file says which part it is: `split.no` (0-based) and
/// `split.count`, when present, must match its place among `n` parts.
pub(crate) fn check_split_part(
    h: &GgufHeader,
    index: usize,
    n: usize,
) -> std::result::Result<(), Malformed> {
    let mut problems = Vec::new();
    for (k, want) in [("split.no", index), ("split.count", n)] {
        match h.meta.get(k) {
            None => {}
            Some(Meta::Int(v)) if *v == want as i128 => {}
            Some(v) => problems.push(format!(
                "`{k}` = {v}, but it is part {} of {n} by its name",
                index + 1
            )),
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the split parts are not in order: {} (parts renamed or mixed up?)",
            problems.join("; ")
        )
        .into())
    }
}

/// Read one value of GGUF type `t`: a scalar or a string of at most 4 KiB
/// as itself, a longer string as its length, an array as its length (its
/// elements skipped, bounded as in [`skip_value`]).
fn read_value<R: Read>(
    r: &mut Reader<R>,
    t: u32,
    key: &str,
) -> std::result::Result<Meta, Malformed> {
    let what = format!("value of `{key}`");
    let int = |b: &[u8], signed: bool| -> i128 {
        let mut a = [0u8; 16];
        a[..b.len()].copy_from_slice(b);
        if signed && b.last().is_some_and(|x| x & 0x80 != 0) {
            a[b.len()..].fill(0xff);
        }
        i128::from_le_bytes(a)
    };
    Ok(match t {
        0 | 7 => Meta::Int(int(&r.bytes(1, &what)?, false)),
        1 => Meta::Int(int(&r.bytes(1, &what)?, true)),
        2 => Meta::Int(int(&r.bytes(2, &what)?, false)),
        3 => Meta::Int(int(&r.bytes(2, &what)?, true)),
        4 => Meta::Int(int(&r.bytes(4, &what)?, false)),
        5 => Meta::Int(int(&r.bytes(4, &what)?, true)),
        10 => Meta::Int(int(&r.bytes(8, &what)?, false)),
        11 => Meta::Int(int(&r.bytes(8, &what)?, true)),
        6 => Meta::Float(f64::from(f32::from_le_bytes(
            r.bytes(4, &what)?.try_into().expect("4 bytes"),
        ))),
        12 => Meta::Float(f64::from_le_bytes(
            r.bytes(8, &what)?.try_into().expect("8 bytes"),
        )),
        8 => {
            let n = r.u64(&what)?;
            if n <= 4096 {
                Meta::Str(String::from_utf8_lossy(&r.bytes(n, &what)?).into_owned())
            } else {
                r.skip(n, &what)?;
                Meta::LongStr(n)
            }
        }
        9 => {
            let et = r.u32(&format!("array type of `{key}`"))?;
            let n = r.u64(&format!("array length of `{key}`"))?;
            skip_array(r, et, n, key, 0)?;
            Meta::Array(n)
        }
        _ => return Err(format!("`{key}`: unknown value type {t} at offset {}", r.pos).into()),
    })
}

fn skip_value<R: Read>(
    r: &mut Reader<R>,
    t: u32,
    key: &str,
    depth: u32,
) -> std::result::Result<(), Malformed> {
    if let Some(size) = scalar_size(t) {
        return r.skip(size, &format!("value of `{key}`"));
    }
    match t {
        8 => r.skip_string(&format!("value of `{key}`")),
        9 => {
            if depth > 2 {
                return Err(format!("`{key}`: arrays nested too deeply").into());
            }
            let et = r.u32(&format!("array type of `{key}`"))?;
            let n = r.u64(&format!("array length of `{key}`"))?;
            skip_array(r, et, n, key, depth)
        }
        _ => Err(format!("`{key}`: unknown value type {t} at offset {}", r.pos).into()),
    }
}

/// Skip the `n` elements of type `et` of an array at nesting `depth`.
fn skip_array<R: Read>(
    r: &mut Reader<R>,
    et: u32,
    n: u64,
    key: &str,
    depth: u32,
) -> std::result::Result<(), Malformed> {
    if let Some(size) = scalar_size(et) {
        let total = n
            .checked_mul(size)
            .ok_or_else(|| format!("`{key}`: array of {n} elements overflows"))?;
        return r.skip(total, &format!("array `{key}`"));
    }
    // Each string or array element takes at least 8 bytes.
    if n.checked_mul(8).is_none_or(|need| need > r.left()) {
        return Err(format!(
            "`{key}`: array claims {n} elements, more than the {} bytes left can hold",
            r.left()
        )
        .into());
    }
    for _ in 0..n {
        skip_value(r, et, key, depth + 1)?;
    }
    Ok(())
}

/// The files of a GGUF: all parts of a split file
/// (`<stem>-00001-of-00003.gguf`, any part named), in order, else the file.
/// Whether a part exists is for the caller to find out.
pub(crate) fn gguf_parts(path: &Path) -> Vec<std::path::PathBuf> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // <stem>-NNNNN-of-MMMMM.gguf
    let split = name.strip_suffix(".gguf").and_then(|s| {
        let (head, total) = s.rsplit_once("-of-")?;
        let (stem, _) = head.rsplit_once('-')?;
        let n: usize = total.parse().ok()?;
        (total.len() == 5).then(|| (stem.to_string(), n))
    });
    let Some((stem, n)) = split else {
        return vec![path.to_path_buf()];
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    (1..=n)
        .map(|i| dir.join(format!("{stem}-{i:05}-of-{n:05}.gguf")))
        .collect()
}

/// ` (part of the N-part file PATH)` for a part of a split file, else nothing:
/// what a message about one of `parts` adds.
pub(crate) fn part_of(parts: &[std::path::PathBuf], path: &Path) -> String {
    if parts.len() > 1 {
        format!(
            " (part of the {}-part file {})",
            parts.len(),
            path.display()
        )
    } else {
        String::new()
    }
}

/// Sum of a GGUF's bytes, all parts of a split file (`-00001-of-00003.gguf`)
/// added up; a missing part is an error.
pub(crate) fn gguf_total_bytes(path: &Path) -> Result<u64> {
    let mut total = 0u64;
    for p in gguf_parts(path) {
        total += std::fs::metadata(&p)
            .map(|m| m.len())
            .map_err(|e| Error::input(format!("{}: {e}", p.display())))?;
    }
    Ok(total)
}

mod hyper;
use hyper::hyperparameters;

#[cfg(test)]
pub(crate) mod tests;
