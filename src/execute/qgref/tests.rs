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
    let bytes = encode(&h, &rows(), Seal::Plain);
    let (back, r) = decode(&bytes, &h, Seal::Plain).unwrap();
    assert_eq!(back, h);
    assert_eq!(r, rows());
    // Any single flipped byte, any truncation, any trailing byte.
    for i in 0..bytes.len() {
        let mut b = bytes.clone();
        b[i] ^= 0x40;
        assert!(decode(&b, &h, Seal::Plain).is_err(), "flip at {i} accepted");
    }
    for n in 0..bytes.len() {
        assert!(
            decode(&bytes[..n], &h, Seal::Plain).is_err(),
            "truncation to {n} accepted"
        );
    }
    let mut b = bytes.clone();
    b.push(0);
    assert!(decode(&b, &h, Seal::Plain).is_err());
    // Another case's header: refused, naming the difference.
    let mut other = h.clone();
    other.token_stream_sha256 = "c".repeat(64);
    let e = decode(&bytes, &other, Seal::Plain).unwrap_err();
    assert!(e.0.contains("header does not match"), "{e}");
}

/// A cache written row by row is byte for byte the one `encode`
/// writes; read row by row it gives the same rows, and every flipped
/// byte, truncation or trailing byte is refused before a row is read.
#[test]
fn a_cache_written_and_read_row_by_row_is_the_whole_one() {
    let dir = crate::core::scratch::scratch("qgref-stream");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("x.qgref");
    let h = header();
    let mut w = RowWriter::create(&path, h.clone(), Seal::Plain).unwrap();
    for r in &rows()[..rows().len() - 1] {
        w.push(r).unwrap();
    }
    // One short: refused, nothing written.
    let e = w.finish().unwrap_err();
    assert!(e.message.contains("positions written"), "{}", e.message);
    assert!(!path.exists());
    let mut w = RowWriter::create(&path, h.clone(), Seal::Plain).unwrap();
    for r in &rows() {
        w.push(r).unwrap();
    }
    w.finish().unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(bytes, encode(&h, &rows(), Seal::Plain));
    let read_all = |p: &std::path::Path| -> Result<Vec<RefPosition>, Malformed> {
        let mut s = RowStream::open(p, &h, Seal::Plain)?.ok_or("no file")?;
        let mut out = Vec::new();
        for _ in 0..h.positions {
            out.push(s.next_row()?);
        }
        assert!(s.next_row().is_err(), "a row past the last");
        s.finish()?;
        Ok(out)
    };
    assert_eq!(read_all(&path).unwrap(), rows());
    let mut partial = RowStream::open(&path, &h, Seal::Plain).unwrap().unwrap();
    partial.next_row().unwrap();
    assert!(partial.finish().is_err(), "finished with rows left");
    let bad = dir.join("bad.qgref");
    for i in 0..bytes.len() {
        let mut b = bytes.clone();
        b[i] ^= 0x40;
        std::fs::write(&bad, &b).unwrap();
        assert!(
            RowStream::open(&bad, &h, Seal::Plain).is_err(),
            "flip at {i} accepted"
        );
    }
    for n in 0..bytes.len() {
        std::fs::write(&bad, &bytes[..n]).unwrap();
        assert!(
            RowStream::open(&bad, &h, Seal::Plain).is_err(),
            "truncation to {n} accepted"
        );
    }
    let mut b = bytes.clone();
    b.push(0);
    std::fs::write(&bad, &b).unwrap();
    assert!(RowStream::open(&bad, &h, Seal::Plain).is_err());
    let mut other = h.clone();
    other.token_stream_sha256 = "c".repeat(64);
    let e = RowStream::open(&path, &other, Seal::Plain).err().unwrap();
    assert!(e.0.contains("header does not match"), "{e}");
    assert!(RowStream::open(&dir.join("none.qgref"), &h, Seal::Plain)
        .unwrap()
        .is_none());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Read a row at a time under a key, a file edited and sealed again with
/// plain sha256 is refused in the words the whole read uses ("a plain
/// sha256 seal instead"), and one corrupted without a seal as an accident
/// or another key's file.
#[test]
fn a_stream_under_a_key_tells_an_edit_sealed_again_from_an_accident() {
    let dir = tempfile::tempdir().unwrap();
    let key: &'static crate::core::auth::Key = Box::leak(Box::new(
        crate::core::auth::Key::new(b"stream-0123456789abcdef".to_vec(), "the stream key").unwrap(),
    ));
    let h = header();
    let path = dir.path().join("x.qgref");
    let bytes = encode(&h, &rows(), Seal::Keyed(key));
    std::fs::write(&path, &bytes).unwrap();
    assert!(RowStream::open(&path, &h, Seal::Keyed(key))
        .unwrap()
        .is_some());
    let mut body = bytes[..bytes.len() - 32].to_vec();
    body[20] ^= 1;
    std::fs::write(&path, crate::core::fsutil::seal(body.clone())).unwrap();
    let e = RowStream::open(&path, &h, Seal::Keyed(key)).err().unwrap();
    assert!(
        e.0.contains("plain sha256 seal instead") && e.0.contains("the stream key"),
        "{e}"
    );
    let whole = decode(&std::fs::read(&path).unwrap(), &h, Seal::Keyed(key))
        .err()
        .unwrap();
    assert_eq!(e, whole, "the stream and the whole read say the same");
    // Corrupted, seal kept: no plain seal to speak of.
    let mut b = bytes.clone();
    b[20] ^= 1;
    std::fs::write(&path, &b).unwrap();
    let e = RowStream::open(&path, &h, Seal::Keyed(key)).err().unwrap();
    assert!(
        e.0.contains("does not verify") && !e.0.contains("plain sha256"),
        "{e}"
    );
}

/// Rows read several at a time on two threads are those read one at a
/// time, and a file edited and sealed again (so that its rows are what
/// fails) fails with the same first error, at every byte and every cut.
#[test]
fn rows_parsed_on_threads_are_the_rows_read_one_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.qgref");
    let mut h = header();
    h.positions = 7;
    let rows: Vec<RefPosition> = (0..7)
        .map(|i| {
            let row: Vec<f32> = (0..10).map(|j| ((j * 7 + i * 3) % 11) as f32).collect();
            // Some rows whole (no tail), most with one.
            let kept = if i % 3 == 0 { 10 } else { 2 + i % 2 };
            crate::measure::kld::compress_row(&row, &row_stats(&row), 2, 1e-6, kept)
        })
        .collect();
    let bytes = encode(&h, &rows, Seal::Plain);
    let one_at_a_time = |s: &mut RowStream| -> Result<Vec<RefPosition>, Malformed> {
        (0..7).map(|_| s.next_row()).collect()
    };
    let in_parts = |s: &mut RowStream, parts: &[usize]| -> Result<Vec<RefPosition>, Malformed> {
        let mut out = Vec::new();
        for &k in parts {
            out.extend(s.next_rows(k, 2)?);
        }
        Ok(out)
    };
    std::fs::write(&path, &bytes).unwrap();
    let mut s = RowStream::open(&path, &h, Seal::Plain).unwrap().unwrap();
    assert_eq!(in_parts(&mut s, &[2, 4, 1]).unwrap(), rows);
    s.finish().unwrap();
    let body = &bytes[..bytes.len() - 32];
    let mut compared = 0;
    let edits = (0..body.len())
        .flat_map(|i| [0x01u8, 0x40, 0x80].map(|bit| (i, Some(bit))))
        .chain((0..body.len()).map(|n| (n, None)));
    for (i, bit) in edits {
        let edited = match bit {
            Some(bit) => {
                let mut b = body.to_vec();
                b[i] ^= bit;
                b
            }
            None => body[..i].to_vec(),
        };
        std::fs::write(&path, crate::core::fsutil::seal(edited)).unwrap();
        let open = || RowStream::open(&path, &h, Seal::Plain).ok().flatten();
        let Some(mut a) = open() else { continue };
        let want = one_at_a_time(&mut a).and_then(|r| a.finish().map(|()| r));
        for parts in [&[7][..], &[3, 4], &[2, 2, 2, 1]] {
            let mut b = open().unwrap();
            let got = in_parts(&mut b, parts).and_then(|r| b.finish().map(|()| r));
            assert_eq!(got, want, "edit {bit:?} at {i}, parts {parts:?}");
        }
        compared += 1;
    }
    assert!(compared > body.len(), "{compared} edits reached the rows");
}
