use super::*;

#[test]
fn aliases_come_from_file_names() {
    assert_eq!(
        alias_for(Path::new("/x/My Model.Q4_K_M.gguf")),
        "My-Model.Q4_K_M"
    );
    assert_eq!(
        alias_for(Path::new("/x/big-q8_0-00001-of-00003.gguf")),
        "big-q8_0"
    );
    assert_eq!(alias_for(Path::new("/x/.hidden.gguf")), "hidden");
    assert!(is_path_spec("./out/*.gguf") && is_path_spec("path:x") && is_path_spec("a.gguf"));
    assert!(!is_path_spec("smollm2-q8_0"));
}

/// Globs expand to model files, split parts to their first part; the
/// lock pins each once and keeps the entry on the next call; a name
/// that matches nothing is an error naming the pattern.
/// A lock pins files inside its project relative to its folder, so a
/// copy of the project (a CI runner's checkout) reads the same pins at
/// its own paths; a file outside the project stays absolute.
#[test]
fn pins_inside_the_project_move_with_it() {
    let d = tempfile::tempdir().unwrap();
    let here = d.path().join("proj");
    std::fs::create_dir_all(here.join("suites")).unwrap();
    std::fs::create_dir_all(here.join("out")).unwrap();
    std::fs::create_dir_all(d.path().join("elsewhere")).unwrap();
    let gguf = crate::models::gguf::tests::tiny_header();
    std::fs::write(here.join("out/a.gguf"), &gguf).unwrap();
    let other: Vec<u8> = gguf.iter().copied().chain(*b"b").collect();
    std::fs::write(d.path().join("elsewhere/b.gguf"), other).unwrap();
    let reg = here.join("suites/models.toml");
    let mut files = expand("out/a.gguf", &here).unwrap();
    files.extend(expand("../elsewhere/b.gguf", &here).unwrap());
    assert_eq!(pin(&reg, &[], &files, false).unwrap(), ["a", "b"]);
    let text = std::fs::read_to_string(here.join("suites").join(LOCK_FILE)).unwrap();
    assert!(text.contains("path = \"../out/a.gguf\""), "{text}");
    let outside = files[1].display().to_string();
    assert!(text.contains(&format!("path = \"{outside}\"")), "{text}");
    // The project copied elsewhere: the same pins, at the copy's paths.
    let there = d.path().join("checkout");
    std::fs::create_dir_all(there.join("suites")).unwrap();
    std::fs::create_dir_all(there.join("out")).unwrap();
    for f in ["suites/models.lock", "out/a.gguf"] {
        std::fs::copy(here.join(f), there.join(f)).unwrap();
    }
    let moved = Lock::beside(&there.join("suites/models.toml")).unwrap();
    let a = expand("out/a.gguf", &there).unwrap();
    assert_eq!(moved.entries["a"].path, a[0]);
    assert_eq!(moved.alias_of(&a[0]), Some("a"));
    assert_eq!(moved.entries["b"].path, files[1]);
    assert_eq!(
        pin(&there.join("suites/models.toml"), &[], &a, false).unwrap(),
        ["a"]
    );
    // A second alias for one file, written into the lock by hand:
    // refused, naming both aliases and the file.
    let lock = here.join("suites").join(LOCK_FILE);
    let text = std::fs::read_to_string(&lock).unwrap();
    let entry = text[text.find("[a]").unwrap()..]
        .split("\n\n")
        .next()
        .unwrap()
        .replace("[a]", "[a-twin]");
    std::fs::write(&lock, format!("{text}\n{entry}\n")).unwrap();
    let e = Lock::beside(&reg).unwrap_err();
    assert!(
        e.message.contains("[a] and [a-twin] both pin") && e.message.contains("a.gguf"),
        "{}",
        e.message
    );
}

#[test]
fn globs_pin_each_model_once() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    // Tiny GGUF headers with their own trailing bytes (the pins differ).
    let gguf = |tail: &str| {
        let mut b = crate::models::gguf::tests::tiny_header();
        b.extend_from_slice(tail.as_bytes());
        b
    };
    std::fs::create_dir_all(dir.join("out")).unwrap();
    std::fs::write(dir.join("out/a.gguf"), gguf("aaaa")).unwrap();
    for i in 1..=3 {
        std::fs::write(
            dir.join(format!("out/b-{i:05}-of-00003.gguf")),
            gguf(&format!("b{i}")),
        )
        .unwrap();
    }
    std::fs::write(dir.join("out/notes.txt"), b"x").unwrap();
    let files = expand("out/*.gguf", dir).unwrap();
    assert_eq!(files.len(), 2, "{files:?}");
    // README's form, `./out/*.gguf`, under `.` as under any folder; and
    // in a case, `path:./out/*.gguf`.
    assert_eq!(expand("./out/*.gguf", dir).unwrap(), files);
    assert_eq!(expand("path:./out/*.gguf", dir).unwrap(), files);
    assert_eq!(expand("./out/./a.gguf", dir).unwrap(), files[..1]);
    let cwd = std::env::current_dir().unwrap();
    let rel = pathdiff(dir, &cwd);
    let dotted = format!("./{}/out/*.gguf", rel.display());
    assert_eq!(
        expand(&dotted, Path::new(".")).unwrap().len(),
        2,
        "{dotted}"
    );
    assert!(files[1].ends_with("b-00001-of-00003.gguf"));
    let reg = dir.join("models.toml");
    let aliases = pin(&reg, &[], &files, false).unwrap();
    assert_eq!(aliases, ["a", "b"]);
    let lock = Lock::beside(&reg).unwrap();
    let b = &lock.entries["b"];
    let whole: Vec<u8> = [gguf("b1"), gguf("b2"), gguf("b3")].concat();
    assert_eq!(b.bytes, whole.len() as u64);
    assert_eq!(b.parts.len(), 3);
    assert_eq!(b.sha256, fsutil::sha256_bytes(&whole));
    assert_eq!(b.parts[2].sha256, fsutil::sha256_bytes(&gguf("b3")));
    // A changed file keeps its pin (use verifies it); repin takes the new bytes.
    std::fs::write(dir.join("out/a.gguf"), gguf("AAAA")).unwrap();
    pin(&reg, &[], &files, false).unwrap();
    assert_eq!(
        Lock::beside(&reg).unwrap().entries["a"].sha256,
        fsutil::sha256_bytes(&gguf("aaaa"))
    );
    pin(&reg, &[], &files[..1], true).unwrap();
    assert_eq!(
        Lock::beside(&reg).unwrap().entries["a"].sha256,
        fsutil::sha256_bytes(&gguf("AAAA"))
    );
    // A link keeps its own name as its alias; a second name for a
    // pinned file is refused.
    let c = dir.join("out2/c.gguf");
    std::fs::create_dir_all(c.parent().unwrap()).unwrap();
    std::fs::write(&c, gguf("cccc")).unwrap();
    std::os::unix::fs::symlink(&c, dir.join("mine-q8.gguf")).unwrap();
    let linked = expand("mine-q8.gguf", dir).unwrap();
    assert!(linked[0].ends_with("mine-q8.gguf"), "{linked:?}");
    assert_eq!(pin(&reg, &[], &linked, false).unwrap(), ["mine-q8"]);
    let e = pin(&reg, &[], &expand("out2/c.gguf", dir).unwrap(), false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("the same file as `mine-q8`"), "{e}");
    // Named twice in one glob (the link and its target): one model.
    std::os::unix::fs::symlink(dir.join("out/a.gguf"), dir.join("out/a-link.gguf")).unwrap();
    let both = expand("out/a*.gguf", dir).unwrap();
    assert!(
        both.len() == 1 && both[0].ends_with("out/a.gguf"),
        "{both:?}"
    );
    std::fs::remove_file(dir.join("out/a-link.gguf")).unwrap();
    // Not a GGUF (random bytes, text, a git-lfs pointer): refused,
    // naming the file, and never pinned.
    let before = std::fs::read_to_string(dir.join(LOCK_FILE)).unwrap();
    for (name, bytes) in [
        ("junk.gguf", vec![7u8; 4096]),
        (
            "lfs.gguf",
            b"version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 9\n".to_vec(),
        ),
    ] {
        let f = dir.join("out").join(name);
        std::fs::write(&f, bytes).unwrap();
        let e = pin(&reg, &[], &[f], false).unwrap_err().to_string();
        assert!(e.contains(name) && e.contains("not a usable GGUF"), "{e}");
    }
    assert_eq!(
        std::fs::read_to_string(dir.join(LOCK_FILE)).unwrap(),
        before
    );
    // A registry alias is not taken over.
    let e = pin(&reg, &["a".to_string()], &files, false).unwrap_err();
    assert!(e.to_string().contains("already a model"), "{e}");
    let e = expand("out/*.bin", dir).unwrap_err().to_string();
    assert!(
        e.contains("out/*.bin") && e.contains("matches no file"),
        "{e}"
    );
}

/// `to` relative to `from` (both absolute), with `..` steps.
fn pathdiff(to: &Path, from: &Path) -> PathBuf {
    let (to, from): (Vec<_>, Vec<_>) = (to.components().collect(), from.components().collect());
    let common = to.iter().zip(&from).take_while(|(a, b)| a == b).count();
    let mut p = PathBuf::new();
    for _ in common..from.len() {
        p.push("..");
    }
    for c in &to[common..] {
        p.push(c);
    }
    p
}
