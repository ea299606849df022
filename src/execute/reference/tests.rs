use super::*;
use crate::execute::record::RecordHeader;
use crate::execute::windows::Scored;
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

/// A plan of two 64-token windows, its windowing and a record header.
fn scores_fixture() -> (crate::execute::windows::ScoringPlan, String, RecordHeader) {
    use crate::execute::windows::{plan_windows, Windowing};
    let ids: Vec<crate::engine::TokenId> = (0..300).map(|i| (i % 50) as _).collect();
    let w = Windowing::LlamaPerplexity {
        n_ctx: 64,
        chunks: Some(2),
        skip: 0,
    };
    let plan = plan_windows(&ids, &w, Some(1)).unwrap();
    let header = RecordHeader {
        quantgate_reference_record: 1,
        model: "ref".into(),
        model_sha256: "a".repeat(64),
        build: "build".into(),
        n_vocab: 64,
        tokenizer_fingerprint: "fp".into(),
        mode: "llama-perplexity".into(),
        windows: 2,
        targets: plan.targets(),
        token_stream_sha256: plan.token_stream_sha256.clone(),
        settings: None,
    };
    (plan, format!("{w:?}"), header)
}

/// Scores of `plan` with NLL `v` at every target.
fn scored_at(plan: &crate::execute::windows::ScoringPlan, v: f64) -> Scored {
    let n = plan.targets();
    Scored {
        windows: vec![
            crate::measure::WindowNll {
                nll_sum: v * (n / 2) as f64,
                nll_sq_sum: v * v * (n / 2) as f64,
                count: n / 2,
                top1: 0,
            };
            2
        ],
        token_nll: vec![v; n],
        token_top1: vec![false; n],
        token_argmax: vec![0; n],
        decode: std::time::Duration::ZERO,
        measure: std::time::Duration::ZERO,
    }
}

/// A scores file is read only for the settings that scored it: one
/// copied under the name of the same product with flash attention on
/// (it was accepted, and moved ΔNLL) is unusable and scored again.
#[test]
fn a_scores_file_copied_under_another_settings_name_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let store = ReferenceStore::with_shipped(
        d.path().to_path_buf(),
        Ok(None),
        &crate::core::config::Config::load().unwrap(),
    );
    let (plan, windowing, header) = scores_fixture();
    let scored = || scored_at(&plan, 1.5);
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
        windowing: windowing.clone(),
    };
    store.put_scores(&key(&off), &header, scored()).unwrap();
    let (_, off_file) = store.scores_file(&key(&off));
    let (_, on_file) = store.scores_file(&key(&on));
    assert_ne!(off_file, on_file);
    assert!(ReferenceStore::load_scores(
        &key(&off),
        &off_file,
        Seal::local(&crate::core::config::Config::load().unwrap())
    )
    .unwrap()
    .is_some());
    std::fs::copy(&off_file, &on_file).unwrap();
    let e = ReferenceStore::load_scores(
        &key(&on),
        &on_file,
        Seal::local(&crate::core::config::Config::load().unwrap()),
    )
    .unwrap_err();
    assert!(e.0.contains("scored under other settings"), "{e}");
}

/// A shipped folder is read first and never written; what it lacks is
/// an error naming the product (or, with `compute`, computed into the
/// local cache); a corrupt shipped file is never used.
#[test]
fn a_shipped_reference_folder_is_read_only_and_complete_or_refused() {
    let root = crate::core::scratch::scratch("shipped");
    let built = std::cell::Cell::new(0);
    // Build the artifact as `quantgate reference build` does.
    let art = root.join("artifact");
    let mut builder = ReferenceStore::with_shipped(
        art.clone(),
        Ok(None),
        &crate::core::config::Config::load().unwrap(),
    );
    builder.seal = Seal::shipped(&crate::core::config::Config::load().unwrap());
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
            &crate::core::config::Config::load().unwrap(),
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
        Err(crate::core::error::Error::input(format!(
            "{REFERENCE_MISSING_ENV}=`x`: expected `error` or `compute`"
        ))),
        &crate::core::config::Config::load().unwrap(),
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
    let root = crate::core::scratch::scratch("kept");
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
    let one = ReferenceStore::with_shipped(
        root.clone(),
        Ok(None),
        &crate::core::config::Config::load().unwrap(),
    );
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
    let fresh = || {
        ReferenceStore::with_shipped(
            root.clone(),
            Ok(None),
            &crate::core::config::Config::load().unwrap(),
        )
    };
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
    write_sealed_with(
        &path_of("a"),
        other,
        Seal::local(&crate::core::config::Config::load().unwrap()),
    )
    .unwrap();
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

/// A test key, as the signing key would be.
fn test_key(name: &str) -> &'static crate::core::auth::Key {
    Box::leak(Box::new(
        crate::core::auth::Key::new(format!("{name}-0123456789abcdef").into_bytes(), name).unwrap(),
    ))
}

/// Flip one byte inside the body of a sealed file and seal it again with
/// plain sha256, as anyone who can write the folder can.
fn forge(path: &Path, at: usize) -> Vec<u8> {
    let bytes = std::fs::read(path).unwrap();
    let mut body = bytes[..bytes.len() - 32].to_vec();
    body[at] ^= 0x01;
    let forged = crate::core::fsutil::seal(body);
    std::fs::write(path, &forged).unwrap();
    forged
}

/// Every reference product (rows `.qgref`, scores `.qgscores`, a kept
/// product such as `.qgmc`) edited and sealed again with sha256: under a
/// key it is never read back (the local cache computes it again; a
/// shipped folder is an error naming the file and the plain seal); a
/// product of another key is refused too. Without a key a shipped copy
/// is read (its sha256 holds), and the store says so.
#[test]
fn a_product_edited_and_sealed_again_is_never_read_back_under_a_key() {
    let d = tempfile::tempdir().unwrap();
    let key = test_key("signing");
    let keyed = |dir: &Path, shipped: Option<&Path>| {
        let mut s = ReferenceStore::with_shipped(
            dir.to_path_buf(),
            Ok(shipped.map(|p| Shipped {
                dir: p.to_path_buf(),
                missing: Missing::Error,
            })),
            &crate::core::config::Config::load().unwrap(),
        );
        s.seal = Seal::Keyed(key);
        s.shipped_seal = Seal::Keyed(key);
        s
    };
    // Rows: built into a folder for shards under the key.
    let art = d.path().join("art");
    let built = std::cell::Cell::new(0);
    fetch(&keyed(&art, None), &built).unwrap();
    let (_, rows_file) = keyed(&art, None).rows_product(&header());
    let good = std::fs::read(&rows_file).unwrap();
    assert!(fetch(&keyed(&d.path().join("c1"), Some(&art)), &built).is_ok());
    assert_eq!(built.get(), 1, "read from the shipped folder");
    // Edited in its header's JSON (past the magic) and sealed again.
    forge(&rows_file, 20);
    let e = fetch(&keyed(&d.path().join("c2"), Some(&art)), &built).unwrap_err();
    assert!(
        e.message.contains(&rows_file.display().to_string()),
        "{}",
        e.message
    );
    assert!(e.message.contains("plain sha256 seal"), "{}", e.message);
    assert_eq!(e.kind, crate::core::ErrorKind::Input);
    assert_eq!(built.get(), 1, "nothing computed, nothing read");
    // Another key's file: refused, naming the key it was checked with.
    std::fs::write(&rows_file, &good).unwrap();
    let mut other = keyed(&d.path().join("c3"), Some(&art));
    other.shipped_seal = Seal::Keyed(test_key("another"));
    let e = fetch(&other, &built).unwrap_err();
    assert!(e.message.contains("does not verify"), "{}", e.message);
    // The local cache: a forged copy is computed again, never read.
    let local = d.path().join("local");
    fetch(&keyed(&local, None), &built).unwrap();
    assert_eq!(built.get(), 2);
    forge(&keyed(&local, None).rows_product(&header()).1, 20);
    fetch(&keyed(&local, None), &built).unwrap();
    assert_eq!(built.get(), 3, "rebuilt, not read");
    // Without a key: a plain shipped copy is read (and named
    // unauthenticated on stderr); a keyed one cannot be checked and is
    // refused.
    let plain_art = d.path().join("plain");
    let mut plain_builder = ReferenceStore::with_shipped(
        plain_art.clone(),
        Ok(None),
        &crate::core::config::Config::load().unwrap(),
    );
    plain_builder.seal = Seal::Plain;
    fetch(&plain_builder, &built).unwrap();
    let unkeyed = |dir: &Path| {
        let mut s = ReferenceStore::with_shipped(
            d.path().join("c4"),
            Ok(Some(Shipped {
                dir: dir.to_path_buf(),
                missing: Missing::Error,
            })),
            &crate::core::config::Config::load().unwrap(),
        );
        s.shipped_seal = Seal::Plain;
        s
    };
    let n = built.get();
    assert!(fetch(&unkeyed(&plain_art), &built).is_ok());
    assert_eq!(built.get(), n);
    assert!(unauthenticated_warning(&rows_file).contains("is unauthenticated"));
    assert!(fetch(&unkeyed(&art), &built).is_err());

    // Scores.
    let (plan, windowing, header) = scores_fixture();
    let settings = Settings::new(64, 1);
    let skey = ScoresKey {
        alias: "ref",
        model_sha256: &header.model_sha256,
        plan: &plan,
        settings: &settings,
        build: "build",
        windowing,
    };
    let scored = |v: f64| scored_at(&plan, v);
    let scores_art = d.path().join("scores");
    keyed(&scores_art, None)
        .put_scores(&skey, &header, scored(1.5))
        .unwrap();
    let (_, scores_file) = keyed(&scores_art, None).scores_product(&skey);
    let shard = keyed(&d.path().join("c5"), Some(&scores_art));
    let got = shard
        .scores(&skey, &"case.toml", &|| panic!("computed"))
        .unwrap();
    assert_eq!(got.scored.token_nll[0], 1.5);
    // A lower reference NLL written in: every candidate's ΔNLL would rise
    // or fall by it. Sealed again with sha256: refused, naming the file.
    let bytes = std::fs::read(&scores_file).unwrap();
    let body = &bytes[..bytes.len() - 32];
    let edited = String::from_utf8_lossy(body).replace("-1.5", "-0.5");
    assert_ne!(edited.as_bytes(), body);
    std::fs::write(&scores_file, crate::core::fsutil::seal(edited.into_bytes())).unwrap();
    let shard = keyed(&d.path().join("c6"), Some(&scores_art));
    let e = match shard.scores(&skey, &"case.toml", &|| panic!("computed")) {
        Err(e) => e,
        Ok(_) => panic!("a forged scores file was read"),
    };
    assert!(
        e.message.contains(&scores_file.display().to_string()),
        "{}",
        e.message
    );
    assert!(e.message.contains("plain sha256 seal"), "{}", e.message);
    // In the local cache: scored again.
    let local = keyed(&scores_art, None);
    let again = std::cell::Cell::new(0);
    local
        .scores(&skey, &"case.toml", &|| {
            again.set(again.get() + 1);
            Ok((header.clone(), scored(1.5)))
        })
        .unwrap();
    assert_eq!(again.get(), 1, "rescored, not read");

    // A kept product (multiple-choice scores are kept so).
    let kept_dir = d.path().join("kept");
    let made = std::cell::Cell::new(0);
    let get = |store: &ReferenceStore| {
        store
            .kept("mc", "qgmc", &|_: &Vec<f64>| true, &|| {
                made.set(made.get() + 1);
                Ok(vec![-0.25, -3.0])
            })
            .unwrap()
    };
    get(&keyed(&kept_dir, None));
    let kept_file = std::fs::read_dir(&kept_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "qgmc"))
        .unwrap();
    let text = std::fs::read(&kept_file).unwrap();
    let body = String::from_utf8_lossy(&text[..text.len() - 32]).replace("-3.0", "-0.1");
    std::fs::write(&kept_file, crate::core::fsutil::seal(body.into_bytes())).unwrap();
    assert_eq!(*get(&keyed(&kept_dir, None)), vec![-0.25, -3.0]);
    assert_eq!(made.get(), 2, "computed again, not read");
    assert!(keyed(&kept_dir, None)
        .kept_only::<Vec<f64>>("none", "qgmc")
        .is_none());
}
