//! Reference caches written and read a row at a time, never held whole:
//! [`RowWriter`] as a reference decode gives its rows, [`RowStream`] as
//! candidates read them (its seal checked over the whole file first).

use super::{encode_head, encode_row, read_head, read_row, CacheHeader, Reader, Source, MAGIC};
use crate::core::auth::{Seal, SealHasher};
use crate::core::error::Malformed;
use crate::measure::kld::{RefPosition, LEVELS};

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
/// once), then each row is parsed and checked as [`super::decode`] checks it when
/// it is asked for; [`RowStream::finish`] checks that every position was
/// read and nothing follows.
pub(crate) struct RowStream {
    src: FileSource,
    header: CacheHeader,
    next: usize,
}

impl RowStream {
    /// The cache at `path` checked against `expect` as [`super::decode`] checks
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
                let mut r = Reader::record(&bytes, start, Some(e.clone()));
                let cut = read_row(&mut r, &self.header, p).err().unwrap_or(e);
                // A bad row before this one is the first error.
                for (j, (start, bytes)) in records.iter().enumerate() {
                    read_row(
                        &mut Reader::record(bytes, *start, None),
                        &self.header,
                        self.next + j,
                    )?;
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
                                let mut r = Reader::record(bytes, *start, None);
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
