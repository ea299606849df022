use super::*;

/// A minimal valid GGUF v3 header with one string KV and one tensor.
pub(crate) fn tiny_header() -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(b"GGUF");
    v.extend_from_slice(&3u32.to_le_bytes());
    v.extend_from_slice(&1u64.to_le_bytes()); // tensors
    v.extend_from_slice(&1u64.to_le_bytes()); // kv
    let key = b"general.architecture";
    v.extend_from_slice(&(key.len() as u64).to_le_bytes());
    v.extend_from_slice(key);
    v.extend_from_slice(&8u32.to_le_bytes());
    v.extend_from_slice(&5u64.to_le_bytes());
    v.extend_from_slice(b"llama");
    let name = b"w";
    v.extend_from_slice(&(name.len() as u64).to_le_bytes());
    v.extend_from_slice(name);
    v.extend_from_slice(&2u32.to_le_bytes());
    v.extend_from_slice(&4u64.to_le_bytes());
    v.extend_from_slice(&4u64.to_le_bytes());
    v.extend_from_slice(&8u32.to_le_bytes()); // Q8_0
    v.extend_from_slice(&0u64.to_le_bytes());
    // The data section: aligned to 32, one Q8_0 block.
    v.resize(v.len().div_ceil(32) * 32 + 34, 0);
    v
}

/// A header with string KVs and string-array KVs, no tensors.
fn header_with(kvs: &[(&str, &[&str])]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(b"GGUF");
    v.extend_from_slice(&3u32.to_le_bytes());
    v.extend_from_slice(&0u64.to_le_bytes());
    v.extend_from_slice(&(kvs.len() as u64).to_le_bytes());
    let s = |v: &mut Vec<u8>, x: &str| {
        v.extend_from_slice(&(x.len() as u64).to_le_bytes());
        v.extend_from_slice(x.as_bytes());
    };
    for (k, vals) in kvs {
        s(&mut v, k);
        if vals.len() == 1 {
            v.extend_from_slice(&8u32.to_le_bytes());
            s(&mut v, vals[0]);
        } else {
            v.extend_from_slice(&9u32.to_le_bytes());
            v.extend_from_slice(&8u32.to_le_bytes());
            v.extend_from_slice(&(vals.len() as u64).to_le_bytes());
            for x in *vals {
                s(&mut v, x);
            }
        }
    }
    v
}

/// A header of typed scalars: `u` a u32 (type 4), `i` an i32 (type 5),
/// `f` an f32 (type 6), `s` a string.
fn header_typed(kvs: &[(&str, char, &str)]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(b"GGUF");
    v.extend_from_slice(&3u32.to_le_bytes());
    v.extend_from_slice(&0u64.to_le_bytes());
    v.extend_from_slice(&(kvs.len() as u64).to_le_bytes());
    for (k, t, val) in kvs {
        v.extend_from_slice(&(k.len() as u64).to_le_bytes());
        v.extend_from_slice(k.as_bytes());
        match t {
            'u' => {
                v.extend_from_slice(&4u32.to_le_bytes());
                v.extend_from_slice(&val.parse::<u32>().unwrap().to_le_bytes());
            }
            'i' => {
                v.extend_from_slice(&5u32.to_le_bytes());
                v.extend_from_slice(&val.parse::<i32>().unwrap().to_le_bytes());
            }
            'f' => {
                v.extend_from_slice(&6u32.to_le_bytes());
                v.extend_from_slice(&val.parse::<f32>().unwrap().to_le_bytes());
            }
            _ => {
                v.extend_from_slice(&8u32.to_le_bytes());
                v.extend_from_slice(&(val.len() as u64).to_le_bytes());
                v.extend_from_slice(val.as_bytes());
            }
        }
    }
    v
}

/// What llama.cpp asserts on (an abort of the whole process) is an
/// input error naming the key; a well-formed model's values pass.
#[test]
fn hyperparameters_llama_cpp_aborts_on_are_input_errors() {
    let good: Vec<(&str, char, &str)> = vec![
        ("general.architecture", 's', "llama"),
        ("llama.block_count", 'u', "30"),
        ("llama.embedding_length", 'u', "576"),
        ("llama.attention.head_count", 'u', "9"),
        ("llama.attention.head_count_kv", 'u', "3"),
        ("llama.attention.layer_norm_rms_epsilon", 'f', "0.00001"),
        ("llama.context_length", 'u', "8192"),
        ("llama.feed_forward_length", 'u', "1536"),
        ("llama.rope.dimension_count", 'u', "64"),
        ("llama.expert_count", 'u', "0"),
        ("llama.expert_used_count", 'u', "0"),
    ];
    preflight_bytes(&header_typed(&good)).unwrap();
    let with = |key: &str, t: char, val: &'static str| {
        let kvs: Vec<(&str, char, &str)> = good
            .iter()
            .map(|kv| if kv.0 == key { (kv.0, t, val) } else { *kv })
            .collect();
        preflight_bytes(&header_typed(&kvs)).unwrap_err()
    };
    for (key, t, val, says) in [
        (
            "llama.attention.layer_norm_rms_epsilon",
            'f',
            "-1",
            "eps >= 0.0f",
        ),
        (
            "llama.attention.layer_norm_rms_epsilon",
            'f',
            "NaN",
            "finite",
        ),
        (
            "llama.attention.layer_norm_rms_epsilon",
            's',
            "tiny",
            "finite",
        ),
        ("llama.block_count", 'u', "0", "1 to 512 blocks"),
        ("llama.block_count", 'u', "513", "1 to 512 blocks"),
        (
            "llama.attention.head_count",
            'u',
            "0",
            "at least one attention head",
        ),
        (
            "llama.attention.head_count_kv",
            'u',
            "0",
            "divides the heads by it",
        ),
        ("llama.attention.head_count_kv", 'u', "2", "does not divide"),
        ("llama.embedding_length", 'u', "577", "not a multiple"),
        ("llama.block_count", 'i', "-3", "1 to 512 blocks"),
        ("llama.context_length", 'i', "-1", "must be at least 1"),
        ("llama.context_length", 'u', "0", "must be at least 1"),
        ("llama.feed_forward_length", 'u', "0", "must be at least 1"),
        ("llama.feed_forward_length", 'i', "-5", "must be at least 1"),
        ("llama.rope.dimension_count", 'u', "0", "an even number"),
        ("llama.rope.dimension_count", 'u', "63", "an even number"),
        ("llama.rope.dimension_count", 'u', "128", "head width (64)"),
        (
            "llama.expert_used_count",
            'u',
            "2",
            "more experts than there are",
        ),
    ] {
        let e = with(key, t, val);
        assert!(
            e.0.contains(&format!("`{key}`")) && e.0.contains(says),
            "{key}={val}: {e}"
        );
    }
    // With a key length the heads need not divide the width (Gemma-3).
    let mut gemma = good.clone();
    gemma[2] = ("llama.embedding_length", 'u', "640");
    gemma[3] = ("llama.attention.head_count", 'u', "4");
    gemma[4] = ("llama.attention.head_count_kv", 'u', "1");
    gemma.push(("llama.attention.key_length", 'u', "256"));
    gemma[8] = ("llama.rope.dimension_count", 'u', "256");
    preflight_bytes(&header_typed(&gemma)).unwrap();
    // Split numbering.
    let part = |no: &'static str, count: &'static str| {
        let mut kvs = good.clone();
        kvs.push(("split.no", 'u', no));
        kvs.push(("split.count", 'u', count));
        preflight_bytes(&header_typed(&kvs)).unwrap()
    };
    check_split_part(&part("1", "3"), 1, 3).unwrap();
    let e = check_split_part(&part("2", "3"), 1, 3).unwrap_err();
    assert!(e.0.contains("`split.no` = 2, but it is part 2 of 3"), "{e}");
    let e = check_split_part(&part("1", "4"), 1, 3).unwrap_err();
    assert!(e.0.contains("`split.count` = 4"), "{e}");
}

/// The tokenizer hash covers the vocabulary, merges and every other
/// `tokenizer.*` entry, not the chat template nor other metadata.
#[test]
fn the_tokenizer_hash_is_the_tokenizer_definition() {
    let hash =
        |kvs: &[(&str, &[&str])]| preflight_bytes(&header_with(kvs)).unwrap().tokenizer_sha256;
    let base: &[(&str, &[&str])] = &[
        ("general.name", &["a"]),
        ("tokenizer.ggml.tokens", &["x", "y", "z"]),
        ("tokenizer.ggml.merges", &["x y", "xy z"]),
        ("tokenizer.chat_template", &["{{ t }}"]),
    ];
    let h = hash(base);
    let mut other_name = base.to_vec();
    other_name[0] = ("general.name", &["b"]);
    assert_eq!(hash(&other_name), h, "general.* is not the tokenizer");
    let mut other_template = base.to_vec();
    other_template[3] = ("tokenizer.chat_template", &["{{ u }}"]);
    assert_eq!(
        hash(&other_template),
        h,
        "the chat template is not the tokenizer"
    );
    let mut other_merges = base.to_vec();
    other_merges[2] = ("tokenizer.ggml.merges", &["y z", "x yz"]);
    assert_ne!(hash(&other_merges), h, "merges are the tokenizer");
    let mut other_tokens = base.to_vec();
    other_tokens[1] = ("tokenizer.ggml.tokens", &["x", "y", "w"]);
    assert_ne!(hash(&other_tokens), h);
    // Moving a byte from one token to the next changes the hash.
    let mut shifted = base.to_vec();
    shifted[1] = ("tokenizer.ggml.tokens", &["xy", "", "z"]);
    assert_ne!(hash(&shifted), h);
}

/// The tiny file cut anywhere in its tensor data: an error naming the
/// tensor, not a usable header.
#[test]
fn tensor_data_beyond_the_end_of_the_file_is_caught() {
    let full = tiny_header();
    preflight_bytes(&full).unwrap();
    for cut in [full.len() - 1, full.len() - 34] {
        let e = preflight_bytes(&full[..cut]).unwrap_err();
        assert!(
            e.0.contains("tensor #0 `w`") && e.0.contains("beyond the end of the file"),
            "{cut}: {e}"
        );
    }
}

/// Names and block layouts come from ggml: the GGUF format's fixed
/// ones, types newer than any hand-kept table, retired and unknown ids.
#[test]
fn tensor_types_are_ggmls_own() {
    for (id, name, block, bytes) in [
        (0, "F32", 1, 4),
        (1, "F16", 1, 2),
        (2, "Q4_0", 32, 18),
        (8, "Q8_0", 32, 34),
        (10, "Q2_K", 256, 84),
        (12, "Q4_K", 256, 144),
        (14, "Q6_K", 256, 210),
        (23, "IQ4_XS", 256, 136),
        (30, "BF16", 1, 2),
        (35, "TQ2_0", 256, 66),
        (39, "MXFP4", 32, 17),
    ] {
        assert_eq!(ggml_type_name(id), name, "{id}");
        assert_eq!(ggml_type_size(id), Some((block, bytes)), "{name}");
    }
    assert_eq!(ggml_type_size(4), None, "Q4_2 is retired");
    assert_eq!(ggml_type_name(10_000), "type10000");
    assert_eq!(ggml_type_size(u32::MAX), None);
}

#[test]
fn parses_a_valid_header() {
    let h = preflight_bytes(&tiny_header()).unwrap();
    assert_eq!(h.version, 3);
    assert_eq!(h.architecture.as_deref(), Some("llama"));
    assert_eq!(h.types.get("Q8_0").map(|t| t.tensors), Some(1));
}

#[test]
fn every_truncation_is_an_error_not_a_panic() {
    let full = tiny_header();
    for n in 0..full.len() {
        assert!(
            preflight_bytes(&full[..n]).is_err(),
            "prefix of {n} bytes accepted"
        );
    }
}

#[test]
fn absurd_counts_are_rejected_before_allocation() {
    let mut h = tiny_header();
    h[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    let e = preflight_bytes(&h).unwrap_err();
    assert!(
        e.0.contains("tensor count overflows") || e.0.contains("more than"),
        "{e}"
    );
    let mut h = tiny_header();
    h[16..24].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert!(preflight_bytes(&h)
        .unwrap_err()
        .0
        .contains("metadata entries"));
    // A string length far beyond the file.
    let mut h = tiny_header();
    h[24..32].copy_from_slice(&(1u64 << 62).to_le_bytes());
    assert!(preflight_bytes(&h).unwrap_err().0.contains("claims"));
}

#[test]
fn html_and_lfs_pointers_are_named() {
    let e = preflight_bytes(b"<!DOCTYPE html><html>...</html>").unwrap_err();
    assert!(e.0.contains("HTML"), "{e}");
    let e = preflight_bytes(b"version https://git-lfs.github.com/spec/v1\noid sha256:ab\n")
        .unwrap_err();
    assert!(e.0.contains("git-lfs"), "{e}");
}

#[test]
fn random_mutations_never_panic() {
    // xorshift: deterministic, no dependency.
    let mut s: u64 = 0x9E37_79B9_7F4A_7C15;
    let base = tiny_header();
    for _ in 0..20_000 {
        let mut b = base.clone();
        for _ in 0..(s % 4 + 1) {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let i = (s as usize) % b.len();
            b[i] = (s >> 32) as u8;
        }
        let cut = (s as usize >> 8) % (b.len() + 1);
        let _ = preflight_bytes(&b[..cut]);
        let _ = preflight_bytes(&b);
    }
}
