//! GGUF files through llama.cpp: ggml's tensor types, file types, the
//! vocabulary fingerprint, the loader's size, and the quantizer and
//! splitter (reached through the `Engine` trait).

use super::*;

/// A ggml tensor type, as ggml itself describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GgmlType {
    /// ggml's name, upper-cased as in its `GGML_TYPE_*` enum (`Q4_K`, `MXFP4`, …).
    pub name: String,
    /// Elements per block.
    pub block: u64,
    /// Bytes per block.
    pub bytes: u64,
}

/// What ggml says of type `id`; None for an id it does not know or has
/// retired (a block size of 0).
pub(crate) fn ggml_type(id: u32) -> Option<GgmlType> {
    if id >= llama_cpp_sys_2::GGML_TYPE_COUNT {
        return None;
    }
    let t = id as llama_cpp_sys_2::ggml_type;
    // SAFETY: `t` is below GGML_TYPE_COUNT, the length of ggml's static type
    // table these read; the name is a static NUL-terminated string.
    let (name, block, bytes) = unsafe {
        let name = llama_cpp_sys_2::ggml_type_name(t);
        (
            (!name.is_null()).then(|| CStr::from_ptr(name).to_string_lossy().into_owned()),
            llama_cpp_sys_2::ggml_blck_size(t),
            llama_cpp_sys_2::ggml_type_size(t),
        )
    };
    let block = u64::try_from(block).ok().filter(|&b| b > 0)?;
    Some(GgmlType {
        // ggml spells them `q4_K`, `bf16`: upper-cased, its enum's names.
        name: name?.to_ascii_uppercase(),
        block,
        bytes: bytes as u64,
    })
}

/// The tokenizer fingerprint of the file at `path`, from a vocabulary-only
/// load (no weights read): the one [`Engine::load`] records.
pub(crate) fn vocab_fingerprint(path: &Path) -> Result<String> {
    let backend = backend(false)?;
    let params = LlamaModelParams::default().with_vocab_only(true);
    let model = LlamaModel::load_from_file(backend, path, &params).map_err(|e| {
        Error::input(format!(
            "{}: llama.cpp could not load the vocabulary: {e}",
            path.display()
        ))
    })?;
    Ok(fingerprint(&model))
}

/// What llama.cpp's loader reports of the file at `path` (weights on the
/// CPU): its parameter count and its tensors' bytes, whose ratio is the
/// bits per weight llama.cpp prints.
pub fn loader_size(path: &Path) -> Result<(u64, u64)> {
    let backend = backend(false)?;
    let params = LlamaModelParams::default().with_n_gpu_layers(0);
    let model = LlamaModel::load_from_file(backend, path, &params).map_err(|e| {
        Error::input(format!(
            "{}: llama.cpp could not load the model: {e}",
            path.display()
        ))
    })?;
    Ok((model.n_params(), model.size()))
}

/// The llama.cpp file type for a quant type name (as `llama-quantize` spells it).
pub(crate) fn ftype(name: &str) -> Option<llama_cpp_sys_2::llama_ftype> {
    use llama_cpp_sys_2 as s;
    Some(match name {
        "F16" => s::LLAMA_FTYPE_MOSTLY_F16,
        "BF16" => s::LLAMA_FTYPE_MOSTLY_BF16,
        "Q8_0" => s::LLAMA_FTYPE_MOSTLY_Q8_0,
        "Q6_K" => s::LLAMA_FTYPE_MOSTLY_Q6_K,
        "Q5_K_M" => s::LLAMA_FTYPE_MOSTLY_Q5_K_M,
        "Q5_K_S" => s::LLAMA_FTYPE_MOSTLY_Q5_K_S,
        "Q5_1" => s::LLAMA_FTYPE_MOSTLY_Q5_1,
        "Q5_0" => s::LLAMA_FTYPE_MOSTLY_Q5_0,
        "Q4_K_M" => s::LLAMA_FTYPE_MOSTLY_Q4_K_M,
        "Q4_K_S" => s::LLAMA_FTYPE_MOSTLY_Q4_K_S,
        "Q4_1" => s::LLAMA_FTYPE_MOSTLY_Q4_1,
        "Q4_0" => s::LLAMA_FTYPE_MOSTLY_Q4_0,
        "Q3_K_L" => s::LLAMA_FTYPE_MOSTLY_Q3_K_L,
        "Q3_K_M" => s::LLAMA_FTYPE_MOSTLY_Q3_K_M,
        "Q3_K_S" => s::LLAMA_FTYPE_MOSTLY_Q3_K_S,
        "Q2_K" => s::LLAMA_FTYPE_MOSTLY_Q2_K,
        _ => return None,
    })
}

/// llama.cpp's name for a `general.file_type` value (its `LLAMA_FTYPE_*`
/// constants without the prefix), None for a value this build does not know.
pub(crate) fn ftype_name(id: i128) -> Option<&'static str> {
    use llama_cpp_sys_2 as s;
    const NAMES: &[(llama_cpp_sys_2::llama_ftype, &str)] = &[
        (s::LLAMA_FTYPE_ALL_F32, "F32"),
        (s::LLAMA_FTYPE_MOSTLY_F16, "F16"),
        (s::LLAMA_FTYPE_MOSTLY_Q4_0, "Q4_0"),
        (s::LLAMA_FTYPE_MOSTLY_Q4_1, "Q4_1"),
        (s::LLAMA_FTYPE_MOSTLY_Q8_0, "Q8_0"),
        (s::LLAMA_FTYPE_MOSTLY_Q5_0, "Q5_0"),
        (s::LLAMA_FTYPE_MOSTLY_Q5_1, "Q5_1"),
        (s::LLAMA_FTYPE_MOSTLY_Q2_K, "Q2_K"),
        (s::LLAMA_FTYPE_MOSTLY_Q3_K_S, "Q3_K_S"),
        (s::LLAMA_FTYPE_MOSTLY_Q3_K_M, "Q3_K_M"),
        (s::LLAMA_FTYPE_MOSTLY_Q3_K_L, "Q3_K_L"),
        (s::LLAMA_FTYPE_MOSTLY_Q4_K_S, "Q4_K_S"),
        (s::LLAMA_FTYPE_MOSTLY_Q4_K_M, "Q4_K_M"),
        (s::LLAMA_FTYPE_MOSTLY_Q5_K_S, "Q5_K_S"),
        (s::LLAMA_FTYPE_MOSTLY_Q5_K_M, "Q5_K_M"),
        (s::LLAMA_FTYPE_MOSTLY_Q6_K, "Q6_K"),
        (s::LLAMA_FTYPE_MOSTLY_IQ2_XXS, "IQ2_XXS"),
        (s::LLAMA_FTYPE_MOSTLY_IQ2_XS, "IQ2_XS"),
        (s::LLAMA_FTYPE_MOSTLY_Q2_K_S, "Q2_K_S"),
        (s::LLAMA_FTYPE_MOSTLY_IQ3_XS, "IQ3_XS"),
        (s::LLAMA_FTYPE_MOSTLY_IQ3_XXS, "IQ3_XXS"),
        (s::LLAMA_FTYPE_MOSTLY_IQ1_S, "IQ1_S"),
        (s::LLAMA_FTYPE_MOSTLY_IQ4_NL, "IQ4_NL"),
        (s::LLAMA_FTYPE_MOSTLY_IQ3_S, "IQ3_S"),
        (s::LLAMA_FTYPE_MOSTLY_IQ3_M, "IQ3_M"),
        (s::LLAMA_FTYPE_MOSTLY_IQ2_S, "IQ2_S"),
        (s::LLAMA_FTYPE_MOSTLY_IQ2_M, "IQ2_M"),
        (s::LLAMA_FTYPE_MOSTLY_IQ4_XS, "IQ4_XS"),
        (s::LLAMA_FTYPE_MOSTLY_IQ1_M, "IQ1_M"),
        (s::LLAMA_FTYPE_MOSTLY_BF16, "BF16"),
        (s::LLAMA_FTYPE_MOSTLY_TQ1_0, "TQ1_0"),
        (s::LLAMA_FTYPE_MOSTLY_TQ2_0, "TQ2_0"),
        (s::LLAMA_FTYPE_MOSTLY_MXFP4_MOE, "MXFP4_MOE"),
        (s::LLAMA_FTYPE_MOSTLY_NVFP4, "NVFP4"),
        (s::LLAMA_FTYPE_MOSTLY_Q1_0, "Q1_0"),
        (s::LLAMA_FTYPE_MOSTLY_Q2_0, "Q2_0"),
    ];
    NAMES
        .iter()
        .find(|(v, _)| i128::from(*v) == id)
        .map(|(_, n)| *n)
}

/// Quant type names [`ftype`] accepts.
pub(crate) const QUANT_TYPES: &[&str] = &[
    "F16", "BF16", "Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q5_1", "Q5_0", "Q4_K_M", "Q4_K_S", "Q4_1",
    "Q4_0", "Q3_K_L", "Q3_K_M", "Q3_K_S", "Q2_K",
];

/// Quantize `src` into `dst` with `llama_model_quantize` (default params,
/// `allow_requantize`): byte-identical to `llama-quantize`.
pub(crate) fn quantize(src: &Path, dst: &Path, quant: &str, threads: u32) -> Result<()> {
    let ftype = ftype(quant).ok_or_else(|| {
        Error::input(format!(
            "unknown quant type `{quant}`; expected one of {}",
            QUANT_TYPES.join(", ")
        ))
    })?;
    backend(false)?;
    let c = |p: &Path| {
        std::ffi::CString::new(p.to_string_lossy().as_bytes())
            .map_err(|_| Error::input(format!("{}: path contains NUL", p.display())))
    };
    let (src_c, dst_c) = (c(src)?, c(dst)?);
    // SAFETY: plain C call with valid NUL-terminated paths and a params struct
    // from llama.cpp's own defaults.
    let rc = unsafe {
        let mut params = llama_cpp_sys_2::llama_model_quantize_default_params();
        params.ftype = ftype;
        params.allow_requantize = true;
        params.nthread = threads as i32;
        llama_cpp_sys_2::llama_model_quantize(src_c.as_ptr(), dst_c.as_ptr(), &params)
    };
    if rc != 0 {
        return Err(Error::engine(format!(
            "llama_model_quantize {} -> {} ({quant}) failed with code {rc}",
            src.display(),
            dst.display()
        )));
    }
    Ok(())
}

/// Split the GGUF at `src` into `n` files `<dir>/<stem>-0000i-of-0000n.gguf`
/// as llama.cpp's `gguf-split --split-max-tensors` writes them: the first part
/// holds every metadata entry, each part `split.no`, `split.count` and
/// `split.tensors.count`, and the tensors in order, ⌈tensors / n⌉ per part,
/// their data copied byte for byte. Returns the parts in order.
pub fn split_gguf(src: &Path, dir: &Path, stem: &str, n: u16) -> Result<Vec<std::path::PathBuf>> {
    use llama_cpp_sys_2 as sys;
    use std::ffi::CString;
    use std::io::{Read, Seek, SeekFrom, Write};
    let cstr = |s: &str| CString::new(s).map_err(|_| Error::input(format!("`{s}` contains NUL")));
    let src_c = cstr(&src.to_string_lossy())?;
    let mut meta: *mut sys::ggml_context = std::ptr::null_mut();
    // SAFETY: a valid path and out-pointer; no_alloc reads the header only.
    let g = unsafe {
        sys::gguf_init_from_file(
            src_c.as_ptr(),
            sys::gguf_init_params {
                no_alloc: true,
                ctx: &mut meta,
            },
        )
    };
    if g.is_null() {
        return Err(Error::input(format!(
            "{}: not a GGUF file ggml can read",
            src.display()
        )));
    }
    let result = (|| {
        // SAFETY: `g` and `meta` are valid until freed below.
        let (n_tensors, data_offset) =
            unsafe { (sys::gguf_get_n_tensors(g), sys::gguf_get_data_offset(g)) };
        if n == 0 || i64::from(n) > n_tensors {
            return Err(Error::input(format!(
                "{}: cannot split {n_tensors} tensors into {n} parts",
                src.display()
            )));
        }
        let per = (n_tensors as usize).div_ceil(n as usize);
        let mut input = std::fs::File::open(src).map_err(|e| Error::io(src, e))?;
        let (k_no, k_count, k_tensors) = (
            cstr("split.no")?,
            cstr("split.count")?,
            cstr("split.tensors.count")?,
        );
        let mut parts = Vec::new();
        for i in 0..n {
            let ids: Vec<i64> = ((i as usize * per) as i64
                ..(((i as usize + 1) * per) as i64).min(n_tensors))
                .collect();
            let path = dir.join(format!("{stem}-{:05}-of-{n:05}.gguf", i + 1));
            let path_c = cstr(&path.to_string_lossy())?;
            // SAFETY: `out` is a fresh context freed below; tensors come from `meta`.
            let (ok, align) = unsafe {
                let out = sys::gguf_init_empty();
                if i == 0 {
                    sys::gguf_set_kv(out, g);
                }
                sys::gguf_set_val_u16(out, k_no.as_ptr(), i);
                sys::gguf_set_val_u16(out, k_count.as_ptr(), n);
                sys::gguf_set_val_i32(out, k_tensors.as_ptr(), n_tensors as i32);
                for &t in &ids {
                    let name = sys::gguf_get_tensor_name(g, t);
                    sys::gguf_add_tensor(out, sys::ggml_get_tensor(meta, name));
                }
                let ok = sys::gguf_write_to_file(out, path_c.as_ptr(), true);
                let align = sys::gguf_get_alignment(out);
                sys::gguf_free(out);
                (ok, align)
            };
            if !ok {
                return Err(Error::io(
                    &path,
                    std::io::Error::other("gguf_write_to_file failed"),
                ));
            }
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(&path)
                .map_err(|e| Error::io(&path, e))?;
            for &t in &ids {
                // SAFETY: valid context and tensor id.
                let (off, size) = unsafe {
                    (
                        sys::gguf_get_tensor_offset(g, t),
                        sys::gguf_get_tensor_size(g, t),
                    )
                };
                input
                    .seek(SeekFrom::Start((data_offset + off) as u64))
                    .map_err(|e| Error::io(src, e))?;
                let mut buf = vec![0u8; size];
                input.read_exact(&mut buf).map_err(|e| Error::io(src, e))?;
                buf.resize(size.next_multiple_of(align), 0);
                f.write_all(&buf).map_err(|e| Error::io(&path, e))?;
            }
            f.sync_all().map_err(|e| Error::io(&path, e))?;
            parts.push(path);
        }
        Ok(parts)
    })();
    // SAFETY: freed once, after their last use.
    unsafe {
        sys::gguf_free(g);
        sys::ggml_free(meta);
    }
    result
}
