use super::*;
use crate::measure::kld::compress_row;

fn header() -> CacheHeader {
    rows_header(
        "a".repeat(64),
        &"b".repeat(64),
        "LlamaPerplexity".into(),
        &Settings::new(512, 1),
        "build".into(),
        1e-6,
        16,
        2,
        64,
    )
}

fn rows() -> Vec<RefPosition> {
    (0..2)
        .map(|k| {
            let row: Vec<f32> = (0..64).map(|j| ((j * 7 + k) % 13) as f32 * 0.5).collect();
            compress_row(&row, &crate::measure::row_stats(&row), 3, 1e-6, 16)
        })
        .collect()
}

fn fetch(store: &ReferenceStore, built: &std::cell::Cell<u32>) -> Result<Arc<RefRows>> {
    let candidate = Vocab {
        alias: "cand",
        n_vocab: 64,
        fingerprint: "fp",
    };
    let at = Location("case.toml:3:13".into());
    store.rows(
        &header(),
        Path::new("case.toml"),
        ("ref", &at),
        candidate,
        &|| {
            built.set(built.get() + 1);
            Ok((64, "fp".to_string(), rows()))
        },
    )
}

/// A scores file is read only for the settings that scored it: one
/// copied under the name of the same product with flash attention on
/// (it was accepted, and moved ΔNLL) is unusable and scored again.
#[test]
fn a_scores_file_copied_under_another_settings_name_is_refused() {
    use crate::execute::windows::{plan_windows, Windowing};
    let d = tempfile::tempdir().unwrap();
    let store = ReferenceStore::with_shipped(d.path().to_path_buf(), Ok(None));
    let ids: Vec<crate::engine::TokenId> = (0..300).map(|i| (i % 50) as _).collect();
    let w = Windowing::LlamaPerplexity {
        n_ctx: 64,
        chunks: Some(2),
        skip: 0,
    };
    let plan = plan_windows(&ids, &w, Some(1)).unwrap();
    let n = plan.targets();
    let scored = || Scored {
        windows: vec![
            crate::measure::WindowNll {
                nll_sum: 1.5 * (n / 2) as f64,
                nll_sq_sum: 2.25 * (n / 2) as f64,
                count: n / 2,
                top1: 0,
            };
            2
        ],
        token_nll: vec![1.5; n],
        token_top1: vec![false; n],
        token_argmax: vec![0; n],
        decode: std::time::Duration::ZERO,
        measure: std::time::Duration::ZERO,
    };
    let header = RecordHeader {
        quantgate_reference_record: 1,
        model: "ref".into(),
        model_sha256: "a".repeat(64),
        build: "build".into(),
        n_vocab: 64,
        tokenizer_fingerprint: "fp".into(),
        mode: "llama-perplexity".into(),
        windows: 2,
        targets: n,
        token_stream_sha256: plan.token_stream_sha256.clone(),
        settings: None,
    };
    let off = Settings::new(64, 1);
    let on = Settings {
        flash_attn: true,
        ..off.clone()
    };
    let key = |settings| ScoresKey {
        alias: "ref",
        model_sha256: &header.model_sha256,
        plan: &plan,
        settings,
        build: "build",
        windowing: format!("{w:?}"),
    };
    store.put_scores(&key(&off), &header, scored()).unwrap();
    let (_, off_file) = store.scores_file(&key(&off));
    let (_, on_file) = store.scores_file(&key(&on));
    assert_ne!(off_file, on_file);
    assert!(ReferenceStore::load_scores(&key(&off), &off_file)
        .unwrap()
        .is_some());
    std::fs::copy(&off_file, &on_file).unwrap();
    let e = ReferenceStore::load_scores(&key(&on), &on_file).unwrap_err();
    assert!(e.contains("scored under other settings"), "{e}");
}

/// A shipped folder is read first and never written; what it lacks is
/// an error naming the product (or, with `compute`, computed into the
/// local cache); a corrupt shipped file is never used.
#[test]
fn a_shipped_reference_folder_is_read_only_and_complete_or_refused() {
    let root = std::env::temp_dir().join(format!("qg-shipped-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let built = std::cell::Cell::new(0);
    // Build the artifact as `quantgate reference build` does.
    let art = root.join("artifact");
    let builder = ReferenceStore::with_shipped(art.clone(), Ok(None));
    let made = fetch(&builder, &built).unwrap();
    assert_eq!(built.get(), 1);
    let (_, file) = builder.rows_product(&header());
    let shipped_bytes = std::fs::read(&file).unwrap();
    let ship = |dir: &Path, missing| {
        ReferenceStore::with_shipped(
            root.join("cache"),
            Ok(Some(Shipped {
                dir: dir.to_path_buf(),
                missing,
            })),
        )
    };
    // A shard: read from the artifact, nothing computed or written there,
    // and no reference model loaded by a kind that would load it itself.
    let shard = ship(&art, Missing::Error);
    let e = shard.may_load_reference("ref").unwrap_err();
    assert!(
        e.message.contains("QUANTGATE_REFERENCE_MISSING=compute"),
        "{}",
        e.message
    );
    assert!(ship(&art, Missing::Compute)
        .may_load_reference("ref")
        .is_ok());
    assert!(builder.may_load_reference("ref").is_ok());
    assert_eq!(fetch(&shard, &built).unwrap().rows, made.rows);
    assert_eq!(built.get(), 1);
    assert!(shard.holds(&header().key(), &shard.rows_product(&header()).1));
    // An empty artifact: refused, naming the product and the folder.
    let empty = root.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let e = fetch(&ship(&empty, Missing::Error), &built).unwrap_err();
    assert!(
        e.message.contains("not in the shipped reference folder"),
        "{}",
        e.message
    );
    assert!(
        e.message.contains(&format!("{}.qgref", header().key())),
        "{}",
        e.message
    );
    assert!(e.message.contains("case.toml"), "{}", e.message);
    assert_eq!(built.get(), 1, "refused before any computation");
    // With `compute`: computed here, into the local cache only.
    let local = ship(&empty, Missing::Compute);
    assert_eq!(fetch(&local, &built).unwrap().rows, made.rows);
    assert_eq!(built.get(), 2);
    assert!(std::fs::read_dir(&empty).unwrap().next().is_none());
    // A corrupt shipped copy: an error under `error`, never rows.
    let bad = root.join("bad");
    std::fs::create_dir_all(&bad).unwrap();
    let mut corrupt = shipped_bytes.clone();
    let mid = corrupt.len() / 2;
    corrupt[mid] ^= 1;
    std::fs::write(bad.join(file.file_name().unwrap()), &corrupt).unwrap();
    let e = fetch(&ship(&bad, Missing::Error), &built).unwrap_err();
    assert!(e.message.contains("is unusable"), "{}", e.message);
    assert_eq!(
        std::fs::read(bad.join(file.file_name().unwrap())).unwrap(),
        corrupt
    );
    // An unusable environment refuses to compute, naming the variable.
    let broken = ReferenceStore::with_shipped(
        root.join("cache2"),
        Err(format!(
            "{REFERENCE_MISSING_ENV}=`x`: expected `error` or `compute`"
        )),
    );
    let e = fetch(&broken, &built).unwrap_err();
    assert!(e.message.contains(REFERENCE_MISSING_ENV), "{}", e.message);
    let _ = std::fs::remove_dir_all(&root);
}

/// A kept product is computed once per id: then from the memo, from
/// its file in another process (a new store), and computed again when
/// the file is corrupt, written for another id or of another version;
/// a value `keep` refuses is returned but never written.
#[test]
fn a_kept_product_is_computed_once_and_never_read_back_wrong() {
    let root = std::env::temp_dir().join(format!("qg-kept-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let made = std::cell::Cell::new(0);
    let value = vec![vec![-1.25f64, -0.1 / 3.0], vec![f64::MIN_POSITIVE, 2.0]];
    let get = |store: &ReferenceStore, id: &str, v: &Vec<Vec<f64>>| {
        let v = v.clone();
        store
            .kept(id, "qgtest", &|_: &Vec<Vec<f64>>| true, &|| {
                made.set(made.get() + 1);
                Ok(v.clone())
            })
            .unwrap()
    };
    let one = ReferenceStore::with_shipped(root.clone(), Ok(None));
    assert_eq!(*get(&one, "a", &value), value);
    assert_eq!(*get(&one, "a", &value), value);
    assert_eq!(made.get(), 1, "the memo answers");
    // Another process: read back bitwise from the file.
    let files: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "qgtest"))
        .collect();
    assert_eq!(files.len(), 1);
    let fresh = || ReferenceStore::with_shipped(root.clone(), Ok(None));
    let back = get(&fresh(), "a", &value);
    assert_eq!(made.get(), 1);
    assert!(back
        .iter()
        .flatten()
        .zip(value.iter().flatten())
        .all(|(a, b)| a.to_bits() == b.to_bits()));
    // Another id is another product.
    assert_eq!(*get(&fresh(), "b", &vec![vec![3.0]]), vec![vec![3.0]]);
    assert_eq!(made.get(), 2);
    // A corrupt file is computed again (and rewritten), never read.
    let file = &files[0];
    let mut bytes = std::fs::read(file).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 1;
    std::fs::write(file, &bytes).unwrap();
    assert_eq!(*get(&fresh(), "a", &value), value);
    assert_eq!(made.get(), 3);
    assert_eq!(*get(&fresh(), "a", &value), value);
    assert_eq!(made.get(), 3, "rewritten whole");
    // Intact, but written for another id (or another version): not used.
    let path_of = |id: &str| {
        root.join(format!(
            "{}.qgtest",
            crate::core::fsutil::sha256_bytes(id.as_bytes())
        ))
    };
    std::fs::copy(path_of("b"), path_of("a")).unwrap();
    assert_eq!(*get(&fresh(), "a", &value), value);
    assert_eq!(made.get(), 4);
    let other = br#"{"quantgate_kept":2,"id":"a","value":[[0.0]]}"#.to_vec();
    write_sealed(&path_of("a"), other).unwrap();
    assert_eq!(*get(&fresh(), "a", &value), value);
    assert_eq!(made.get(), 5);
    // Refused by `keep`: returned, not written.
    let nan = vec![vec![f64::NAN]];
    let store = fresh();
    let v = store
        .kept(
            "c",
            "qgtest",
            &|v: &Vec<Vec<f64>>| v.iter().flatten().all(|x| x.is_finite()),
            &|| Ok(nan.clone()),
        )
        .unwrap();
    assert!(v[0][0].is_nan());
    assert!(!path_of("c").exists());
    let _ = std::fs::remove_dir_all(&root);
}
