//! The real llama.cpp engine on the default fixture (SmolLM2-135M-Instruct
//! Q4_1): tokenization, teacher forcing against an independent log-softmax,
//! greedy generation, the chat template, and model sharing between threads.
use crate::common;

use quantgate::core::{Decoding, Settings};
use quantgate::engine::llama::LlamaEngine;
use quantgate::engine::{BosPolicy, Engine, LoadedModel, ModelPool, Window};
use quantgate::measure::row_stats;
use quantgate::models::Registry;
use std::sync::{Arc, OnceLock};

const FIXTURE: &str = "smollm2-q4_1";

fn pool() -> &'static ModelPool {
    static POOL: OnceLock<ModelPool> = OnceLock::new();
    POOL.get_or_init(|| ModelPool::new(Arc::new(LlamaEngine::new())))
}

fn fixture() -> Arc<dyn LoadedModel> {
    pool().get(&fixture_file(FIXTURE)).unwrap()
}

/// The file of fixture `alias` (fetched or derived when missing).
fn fixture_file(alias: &str) -> quantgate::engine::ModelFile {
    common::registry_model(alias).file
}

/// Independent reference: naive f64 log-softmax with libm's exp.
fn naive_logprob(row: &[f32], j: usize) -> f64 {
    common::exact_log_softmax(row)[j]
}

#[test]
fn tokenization_gives_pieces_offsets_and_explicit_bos() {
    let m = fixture();
    let text = "Pi is 3.14159, and the capital of France is Paris.";
    let never = m.tokenize(text, BosPolicy::Never).unwrap();
    let joined: Vec<u8> = never.iter().flat_map(|t| t.piece.clone()).collect();
    assert_eq!(joined, text.as_bytes());
    let mut cursor = 0;
    for t in &never {
        assert_eq!(t.offset, Some(cursor), "{t:?}");
        cursor += t.piece.len();
    }
    let always = m.tokenize(text, BosPolicy::Always).unwrap();
    assert_eq!(always[0].id, m.info().bos);
    assert_eq!(always[0].offset, None);
    assert_eq!(&always[1..], &never[..]);
    let model = m.tokenize(text, BosPolicy::Model).unwrap();
    assert_eq!(model.len(), never.len() + usize::from(m.info().add_bos));
    assert_eq!(m.info().n_vocab, 49_152);
}

#[test]
fn teacher_forced_window_matches_an_independent_log_softmax() {
    let m = fixture();
    let ids: Vec<i32> = m
        .tokenize(
            "The quick brown fox jumps over the lazy dog. The quick brown fox",
            BosPolicy::Always,
        )
        .unwrap()
        .iter()
        .map(|t| t.id)
        .collect();
    let window = Window {
        tokens: ids.clone(),
        logits_from: 0,
    };
    let settings = Settings::new(64, 1);
    let mut rows = 0;
    let mut nll_fast = 0.0;
    let mut nll_naive = 0.0;
    let mut first_pass = Vec::new();
    m.score(
        &settings,
        std::slice::from_ref(&window),
        &mut |w, pos, row| {
            assert_eq!((w, pos), (0, rows));
            assert_eq!(row.len(), 49_152);
            rows += 1;
            if pos + 1 < ids.len() {
                let target = ids[pos + 1] as usize;
                let st = row_stats(row);
                let (a, b) = (st.logprob(row, target), naive_logprob(row, target));
                assert!((a - b).abs() < 1e-9, "position {pos}: {a} vs {b}");
                nll_fast -= a;
                nll_naive -= b;
            }
            first_pass.push(
                row.iter()
                    .map(|v| v.to_bits())
                    .fold(0u64, |h, b| h.rotate_left(5) ^ u64::from(b)),
            );
            Ok(())
        },
    )
    .unwrap();
    assert_eq!(rows, ids.len());
    assert!((nll_fast - nll_naive).abs() < 1e-8);
    // The memorable second "quick brown fox" is easy for the model.
    let mean = nll_naive / (ids.len() - 1) as f64;
    assert!(
        mean.is_finite() && mean > 0.0 && mean < 6.0,
        "mean NLL {mean}"
    );
    // Bitwise reproducible: a second pass gives the same rows.
    let mut i = 0;
    m.score(&settings, &[window], &mut |_, _, row| {
        let h = row
            .iter()
            .map(|v| v.to_bits())
            .fold(0u64, |h, b| h.rotate_left(5) ^ u64::from(b));
        assert_eq!(h, first_pass[i], "row {i} changed between passes");
        i += 1;
        Ok(())
    })
    .unwrap();
}

#[test]
fn greedy_generation_starts_with_the_teacher_forced_argmax() {
    let m = fixture();
    let prompt: Vec<i32> = common::token_ids(&*m, "The capital of France is", BosPolicy::Model);
    let settings = Settings::new(128, 1);
    let out: Vec<i32> = m
        .generate(&settings, &prompt, 8, Decoding::Incremental, &mut |_| false)
        .unwrap()
        .iter()
        .map(|s| s.token)
        .collect();
    assert!(!out.is_empty() && out.len() <= 8);
    let text: Vec<u8> = out.iter().flat_map(|&t| m.piece(t)).collect();
    let text = String::from_utf8_lossy(&text);
    assert!(text.contains("Paris"), "generated {text:?}");
    // Same batch shape as the prompt pass: the first generated token is the
    // argmax of the last teacher-forced row.
    let mut last_argmax = None;
    let window = Window {
        tokens: prompt.clone(),
        logits_from: prompt.len() - 1,
    };
    m.score(&settings, &[window], &mut |_, _, row| {
        last_argmax = Some(quantgate::engine::argmax(row) as i32);
        Ok(())
    })
    .unwrap();
    assert_eq!(last_argmax, Some(out[0]));
    // A stop condition ends generation at once.
    let one = m
        .generate(&settings, &prompt, 8, Decoding::Incremental, &mut |g| {
            !g.is_empty()
        })
        .unwrap();
    assert_eq!(one.len(), 1);
    assert_eq!(one[0].token, out[0]);
}

/// Drafted invariant generation with the smallest passes `min_rows`
/// allows (4 rows: at most 3 drafts per pass) picks the tokens and margins
/// of undrafted invariant generation, bit for bit, on Gemma-3-270M, whose
/// one-row guesses go wrong within a few tokens (drafts replaced).
#[test]
fn drafted_generation_with_four_row_passes_equals_undrafted() {
    let file = fixture_file("gemma3-270m-q4_k_m");
    let load = |engine: &LlamaEngine| engine.load(&file).unwrap();
    let m = load(&LlamaEngine::new());
    let plain = load(&LlamaEngine::without_drafts());
    let prompt: Vec<i32> =
        common::token_ids(&*m, "Pi to 1000 decimal places: 3.", BosPolicy::Model);
    let mut settings = Settings::new(128, 2);
    settings.min_rows = 4;
    let run = |model: &dyn LoadedModel| -> Vec<(i32, u32)> {
        model
            .generate(&settings, &prompt, 24, Decoding::Invariant, &mut |_| false)
            .unwrap()
            .iter()
            .map(|s| (s.token, s.gap.to_bits()))
            .collect()
    };
    let drafted = run(&*m);
    assert_eq!(drafted.len(), 24);
    assert_eq!(drafted, run(&*plain));
}

#[test]
fn chat_template_wraps_the_user_message() {
    let m = fixture();
    let p = m.chat_prompt("Recite pi.", None).unwrap();
    assert!(
        p.contains("<|im_start|>user\nRecite pi.<|im_end|>"),
        "{p:?}"
    );
    assert!(p.trim_end().ends_with("<|im_start|>assistant"), "{p:?}");
}

#[test]
fn threads_share_one_loaded_model_and_agree() {
    let handles: Vec<_> = (0..2)
        .map(|_| {
            std::thread::spawn(|| {
                let m = fixture();
                let ids: Vec<i32> =
                    common::token_ids(&*m, "Hello world, hello world.", BosPolicy::Always);
                let mut sum = 0.0;
                m.score(
                    &Settings::new(32, 1),
                    &[Window {
                        tokens: ids,
                        logits_from: 0,
                    }],
                    &mut |_, _, row| {
                        sum += row_stats(row).log_sum_exp;
                        Ok(())
                    },
                )
                .unwrap();
                (Arc::as_ptr(&m) as *const u8 as usize, sum.to_bits())
            })
        })
        .collect();
    let r: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(r[0], r[1]);
}

/// With two threads or more, one-pass windows are decoded two at a time,
/// each in a context of its own on one share of the threads: the rows must
/// be bitwise those of one context decoding the windows one after another,
/// and in the same order — an odd count of windows (the last pair is one
/// window), windows shorter than `min_rows` (padded) and longer, logits
/// from anywhere.
#[test]
fn windows_decoded_in_two_lanes_give_the_rows_of_one_context_bitwise() {
    let m = fixture();
    let text = "The quick brown fox jumps over the lazy dog. Pi is 3.14159, e is 2.71828. ";
    let ids: Vec<i32> = common::token_ids(&*m, &text.repeat(8), BosPolicy::Always);
    assert!(ids.len() > 200, "{}", ids.len());
    let windows: Vec<Window> = [
        (0, 96, 48),
        (96, 200, 0),
        (10, 30, 5),
        (40, 60, 19),
        (100, 190, 89),
    ]
    .iter()
    .map(|&(a, b, from)| Window {
        tokens: ids[a..b].to_vec(),
        logits_from: from,
    })
    .collect();
    let expected: usize = windows.iter().map(|w| w.tokens.len() - w.logits_from).sum();
    let rows = |threads: u32, min_rows: u32| {
        let mut settings = Settings::new(128, threads);
        settings.min_rows = min_rows;
        let mut out: Vec<(usize, usize, Vec<u32>)> = Vec::new();
        m.score(&settings, &windows, &mut |w, pos, row| {
            out.push((w, pos, row.iter().map(|x| x.to_bits()).collect()));
            Ok(())
        })
        .unwrap();
        out
    };
    for min_rows in [0, 32] {
        let one = rows(1, min_rows);
        assert_eq!(one.len(), expected);
        let two = rows(2, min_rows);
        assert_eq!(two.len(), one.len());
        for (a, b) in one.iter().zip(&two) {
            assert!(
                a == b,
                "min_rows {min_rows}: window {} position {} differs from one context's (window {} position {})",
                b.0,
                b.1,
                a.0,
                a.1
            );
        }
    }
}

#[test]
fn window_longer_than_the_context_is_an_error_naming_the_model() {
    let m = fixture();
    let w = Window {
        tokens: vec![1; 40],
        logits_from: 0,
    };
    let e = m
        .score(&Settings::new(32, 1), &[w], &mut |_, _, _| Ok(()))
        .unwrap_err();
    assert!(
        e.message.contains("model `smollm2-q4_1`") && e.message.contains("sha256 b179c952"),
        "{}",
        e.message
    );
    assert!(
        e.message
            .contains("window 0 has 40 tokens, more than n_ctx 32"),
        "{}",
        e.message
    );
}

#[test]
fn pinned_versions_match_cargo_lock() {
    let lock =
        std::fs::read_to_string(quantgate::harness::project_root().join("Cargo.lock")).unwrap();
    for (name, v) in [
        ("llama-cpp-2", quantgate::engine::llama::LLAMA_CPP_2_VERSION),
        (
            "llama-cpp-sys-2",
            quantgate::engine::llama::LLAMA_CPP_SYS_2_VERSION,
        ),
    ] {
        assert!(
            lock.contains(&format!("name = \"{name}\"\nversion = \"{v}\"")),
            "{name} {v} not in Cargo.lock"
        );
    }
    let b = LlamaEngine::new().build();
    assert!(b.ggml.starts_with("0.26.0"), "{}", b.ggml);
}

/// Sampling several seeds from one prompt decodes the prompt once and
/// reuses its cache and last row: every sample's tokens are bitwise those
/// of sampling it alone in a fresh context (a chat prompt, so the prompt
/// pass is long, and a sampler that keeps many candidates).
#[test]
fn samples_from_one_prompt_equal_samples_each_alone() {
    let m = fixture();
    let prompt: Vec<i32> = m
        .tokenize(
            "Repeat the following digits exactly: 8214808651 3282306647 0938446095",
            BosPolicy::Model,
        )
        .unwrap()
        .iter()
        .map(|t| t.id)
        .collect();
    let settings = Settings::new(256, 1);
    for sampler in [
        quantgate::core::Sampler {
            temperature: 0.7,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
        },
        quantgate::core::Sampler {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
        },
    ] {
        let seeds: Vec<u32> = (1..=3).collect();
        // Stop each sample at a different length, as a follower would.
        let stop_at = |k: usize, g: &[i32]| g.len() >= 2 + 2 * k;
        let many = m
            .sample_many(&settings, &prompt, 8, &sampler, &seeds, &mut |k, g| {
                stop_at(k, g)
            })
            .unwrap();
        for (k, &seed) in seeds.iter().enumerate() {
            let alone = m
                .sample(&settings, &prompt, 8, &sampler, seed, &mut |g| {
                    stop_at(k, g)
                })
                .unwrap();
            assert_eq!(many[k], alone, "seed {seed} with {sampler:?}");
            assert!(!alone.is_empty());
        }
        // The seeds do draw different texts.
        assert!(many
            .windows(2)
            .any(|w| w[0] != w[1][..w[0].len().min(w[1].len())]));
    }
}

/// `inspect` reads the header only; llama.cpp's loader counts the tensors it
/// loaded. On every fixture of the registry the parameter count, the tensor
/// bytes (so the bits per weight), the vocabulary, the training context and
/// the tokenizer fingerprint agree, and every tensor type has ggml's name.
#[test]
fn inspect_agrees_with_llama_cpps_loader_on_every_fixture() {
    let reg =
        Registry::load(&quantgate::harness::project_root().join("suites/models.toml")).unwrap();
    let engine = LlamaEngine::new();
    for alias in reg.models.keys() {
        let v = common::registry_model(alias);
        let i = quantgate::models::inspect::inspect(&v.file.path, true).unwrap();
        let (params, size) = quantgate::engine::llama::loader_size(&v.file.path).unwrap();
        assert_eq!(i.params, params, "{alias}: parameters");
        assert_eq!(i.tensor_bytes, Some(size), "{alias}: tensor bytes");
        let bpw = size as f64 * 8.0 / params as f64;
        assert_eq!(i.bpw(), Some(bpw), "{alias}: bits per weight");
        assert!(i.tensor_bytes.unwrap() < i.bytes, "{alias}: header bytes");
        assert_eq!(i.bytes, v.bytes, "{alias}: file bytes");
        let loaded = engine.load(&v.file).unwrap();
        assert_eq!(i.n_vocab, Some(loaded.info().n_vocab as u64), "{alias}");
        assert_eq!(
            i.context_length,
            Some(i128::from(loaded.info().n_ctx_train)),
            "{alias}"
        );
        assert_eq!(
            i.tokenizer_fingerprint.as_deref(),
            Some(loaded.info().tokenizer_fingerprint.as_str()),
            "{alias}: the vocabulary-only load fingerprints as the engine does"
        );
        assert!(
            i.types
                .iter()
                .all(|t| !t.name.starts_with("type") && t.total.bytes.is_some()),
            "{alias}: {:?}",
            i.types
        );
        let sum: u64 = i.types.iter().map(|t| t.total.elements).sum();
        assert_eq!(sum, params, "{alias}: the histogram covers every tensor");
        assert!(i.file_type.is_some_and(|(_, n)| n.is_some()), "{alias}");
    }
}

/// A model keeps its contexts across calls: a second call with the same
/// settings sets none up, and a context that decoded other windows in
/// between gives, after its cache is cleared, the rows a fresh one gave,
/// bit for bit (one lane and two). Other settings get a context of their
/// own.
#[test]
fn contexts_kept_across_calls_give_a_fresh_contexts_rows() {
    // An engine of its own: what the other tests' models hold and free is
    // not this one's.
    let engine = ModelPool::new(Arc::new(LlamaEngine::new()));
    let m = engine.get(&fixture_file(FIXTURE)).unwrap();
    let text = "Pi is 3.14159, e is 2.71828, and the capital of France is Paris. ";
    let ids: Vec<i32> = common::token_ids(&*m, &text.repeat(6), BosPolicy::Always);
    let window = |a: usize, b: usize, from: usize| Window {
        tokens: ids[a..b].to_vec(),
        logits_from: from,
    };
    let first = vec![window(0, 90, 10), window(20, 110, 45)];
    let other = vec![window(5, 100, 0), window(30, 75, 3)];
    for threads in [1, 2] {
        let settings = Settings::new(112, threads);
        let rows = |windows: &[Window]| {
            let mut out: Vec<(usize, usize, Vec<u32>)> = Vec::new();
            m.score(&settings, windows, &mut |w, pos, row| {
                out.push((w, pos, row.iter().map(|x| x.to_bits()).collect()));
                Ok(())
            })
            .unwrap();
            out
        };
        let before = m.contexts_made();
        let fresh = rows(&first);
        let made = m.contexts_made() - before;
        assert!(made >= 1, "threads {threads}: {made} contexts made");
        let _ = rows(&other);
        let again = rows(&first);
        assert_eq!(
            m.contexts_made() - before,
            made,
            "threads {threads}: contexts set up again for the same settings"
        );
        assert_eq!(fresh.len(), again.len());
        for (a, b) in fresh.iter().zip(&again) {
            assert!(
                a == b,
                "threads {threads}: window {} position {}: a kept context's row differs from a fresh one's",
                a.0,
                a.1
            );
        }
    }
    // Models that take turns free each other's idle contexts: keeping them
    // never raises the peak above what one model's call had in use.
    let other = engine.get(&fixture_file("smollm2-q8_0")).unwrap();
    let settings = Settings::new(112, 2);
    let score = |model: &Arc<dyn LoadedModel>| {
        let before = model.contexts_made();
        model
            .score(&settings, &first, &mut |_, _, _| Ok(()))
            .unwrap();
        model.contexts_made() - before
    };
    assert_eq!(score(&m), 0, "its own contexts kept");
    assert_eq!(
        score(&other),
        2,
        "two lanes set up, the first model's freed"
    );
    assert_eq!(score(&other), 0, "kept for its next call");
    assert_eq!(score(&m), 2, "the first model's were freed for the other's");
    // An engine whose budget keeps nothing (QUANTGATE_CONTEXT_POOL_MIB=0)
    // sets a context up for every call, and computes the same rows.
    let config = quantgate::Config::from_lookup(
        &|k| match k {
            "QUANTGATE_CONTEXT_POOL_MIB" => Some("0".into()),
            _ => std::env::var(k).ok(),
        },
        [None; 3],
    )
    .unwrap();
    assert_eq!(config.context_pool, 0);
    let none = ModelPool::new(Arc::new(LlamaEngine::for_config(&config)))
        .get(&m.info().file)
        .unwrap();
    let settings = Settings::new(112, 1);
    let mut runs = Vec::new();
    for _ in 0..2 {
        let before = none.contexts_made();
        let mut out: Vec<Vec<u32>> = Vec::new();
        none.score(&settings, &first, &mut |_, _, row| {
            out.push(row.iter().map(|x| x.to_bits()).collect());
            Ok(())
        })
        .unwrap();
        assert_eq!(
            none.contexts_made() - before,
            1,
            "nothing kept: a context per call"
        );
        runs.push(out);
    }
    assert!(runs[0] == runs[1]);
}
