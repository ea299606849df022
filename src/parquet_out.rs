//! Parquet output: one file per case × model, one row per scored position
//! (kld cases) or per digit (teacher-forcing cases).
//! The only user of the `parquet` crate.
//!
//! Contract: written to a temp file beside the destination, read back (row
//! count checked) before it is fsynced and renamed into place; a failure at
//! any step leaves no file under the final name and removes the temp file.

use crate::error::{Error, Result};
use crate::fsutil::{commit_temp, temp_path};
use crate::recitation::{DigitRow, DigitRows};
use crate::runner::KldRows;
use parquet::basic::Compression;
use parquet::data_type::{BoolType, ByteArray, ByteArrayType, DoubleType, Int32Type};
use parquet::file::properties::WriterProperties;
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

/// The per-position schema of a kld case (DESIGN.md, Outputs).
pub const KLD_SCHEMA: &str = "message kld_position {
  REQUIRED BYTE_ARRAY case (UTF8);
  REQUIRED BYTE_ARRAY model (UTF8);
  REQUIRED BYTE_ARRAY model_sha256 (UTF8);
  REQUIRED INT32 window;
  REQUIRED INT32 position;
  REQUIRED INT32 token_id;
  REQUIRED DOUBLE nll;
  REQUIRED DOUBLE kl_vs_ref;
  REQUIRED DOUBLE kl_rev;
  REQUIRED DOUBLE ref_p1;
  REQUIRED INT32 ref_top1_token;
  REQUIRED INT32 top1_token;
  REQUIRED BOOLEAN flip;
  REQUIRED DOUBLE p_ref;
  REQUIRED DOUBLE p_cand;
  REQUIRED DOUBLE dp;
  REQUIRED BOOLEAN copy;
  REQUIRED BOOLEAN approximate;
}";

/// One column's values.
enum Col {
    Str(Vec<ByteArray>),
    I32(Vec<i32>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
}

/// Write the rows of one case × model to `dest` atomically.
pub fn write_kld(
    dest: &Path,
    case: &str,
    model: &str,
    model_sha256: &str,
    rows: &KldRows,
) -> Result<()> {
    let n = rows.positions.len();
    if rows.window.len() != n || rows.position.len() != n || rows.target.len() != n {
        return Err(Error::harness(format!(
            "{}: incomplete per-position rows ({n} positions)",
            dest.display()
        )));
    }
    let p = &rows.positions;
    let s = |v: &str| Col::Str(vec![ByteArray::from(v); n]);
    let cols = vec![
        s(case),
        s(model),
        s(model_sha256),
        Col::I32(rows.window.iter().map(|&w| w as i32).collect()),
        Col::I32(rows.position.iter().map(|&w| w as i32).collect()),
        Col::I32(rows.target.clone()),
        Col::F64(rows.token_nll.clone()),
        Col::F64(p.iter().map(|x| x.kl).collect()),
        Col::F64(p.iter().map(|x| x.kl_rev).collect()),
        Col::F64(p.iter().map(|x| x.p1).collect()),
        Col::I32(p.iter().map(|x| x.ref_top as i32).collect()),
        Col::I32(p.iter().map(|x| x.cand_top as i32).collect()),
        Col::Bool(p.iter().map(|x| x.flip()).collect()),
        Col::F64(p.iter().map(|x| x.p_ref).collect()),
        Col::F64(p.iter().map(|x| x.p_cand).collect()),
        Col::F64(p.iter().map(|x| x.dp()).collect()),
        Col::Bool(p.iter().map(|x| x.copy).collect()),
        Col::Bool(p.iter().map(|x| x.approximate).collect()),
    ];
    write_atomic(dest, KLD_SCHEMA, cols, n)
}

/// Write `cols` under `schema` to `dest`: temp file, read back, rename.
fn write_atomic(dest: &Path, schema: &str, cols: Vec<Col>, n: usize) -> Result<()> {
    if let Some(dir) = dest.parent() {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    }
    let tmp = temp_path(dest);
    let result = write_file(&tmp, schema, cols).and_then(|()| {
        let rows_back = read_row_count(&tmp)?;
        if rows_back != n as i64 {
            return Err(Error::harness(format!(
                "{}: read back {rows_back} rows, wrote {n}",
                tmp.display()
            )));
        }
        commit_temp(&tmp, dest)
    });
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// The per-digit schema of a teacher-forcing case (seed 000's columns);
/// the reference's and the samplers' columns only when the case has them.
pub fn digit_schema(rows: &DigitRows) -> String {
    let mut s = String::from(
        "message digit_position {
  REQUIRED BYTE_ARRAY case (UTF8);
  REQUIRED BYTE_ARRAY model (UTF8);
  REQUIRED BYTE_ARRAY model_sha256 (UTF8);
  REQUIRED INT32 position;
  REQUIRED INT32 char_offset;
  REQUIRED INT32 token_index;
  REQUIRED INT32 token_id;
  REQUIRED BYTE_ARRAY piece (UTF8);
  REQUIRED BOOLEAN own_token;
  REQUIRED DOUBLE logprob;
  REQUIRED INT32 rank;
  REQUIRED DOUBLE margin;
  REQUIRED DOUBLE odds;
  REQUIRED INT32 top1_token;
  REQUIRED BYTE_ARRAY top1_piece (UTF8);
",
    );
    if rows.reference {
        s.push_str(
            "  REQUIRED DOUBLE kl_vs_ref;
  REQUIRED BOOLEAN top1_matches_ref;
  REQUIRED DOUBLE ref_margin;
  REQUIRED DOUBLE ref_odds_percentile;
",
        );
    }
    for name in &rows.samplers {
        s.push_str(&format!("  REQUIRED DOUBLE p_pick_{name};\n"));
    }
    s.push('}');
    s
}

/// Write the per-digit rows of one case × model to `dest` atomically.
pub fn write_digits(
    dest: &Path,
    case: &str,
    model: &str,
    model_sha256: &str,
    rows: &DigitRows,
) -> Result<()> {
    let r = &rows.rows;
    let n = r.len();
    let s = |v: &str| Col::Str(vec![ByteArray::from(v); n]);
    let strs =
        |f: &dyn Fn(&DigitRow) -> &str| Col::Str(r.iter().map(|x| ByteArray::from(f(x))).collect());
    let mut cols = vec![
        s(case),
        s(model),
        s(model_sha256),
        Col::I32(r.iter().map(|x| x.unit as i32).collect()),
        Col::I32(r.iter().map(|x| x.char_offset as i32).collect()),
        Col::I32(r.iter().map(|x| x.token_index).collect()),
        Col::I32(r.iter().map(|x| x.token_id).collect()),
        strs(&|x| x.piece.as_str()),
        Col::Bool(r.iter().map(|x| x.own_token).collect()),
        Col::F64(r.iter().map(|x| x.logprob).collect()),
        Col::I32(r.iter().map(|x| x.rank as i32).collect()),
        Col::F64(r.iter().map(|x| x.margin).collect()),
        Col::F64(r.iter().map(|x| x.margin.exp()).collect()),
        Col::I32(r.iter().map(|x| x.top1_token).collect()),
        strs(&|x| x.top1_piece.as_str()),
    ];
    if rows.reference {
        cols.push(Col::F64(r.iter().map(|x| x.kl_vs_ref).collect()));
        cols.push(Col::Bool(r.iter().map(|x| x.top1_matches_ref).collect()));
        cols.push(Col::F64(r.iter().map(|x| x.ref_margin).collect()));
        cols.push(Col::F64(r.iter().map(|x| x.ref_odds_percentile).collect()));
    }
    for i in 0..rows.samplers.len() {
        cols.push(Col::F64(r.iter().map(|x| x.p_pick[i]).collect()));
    }
    write_atomic(dest, &digit_schema(rows), cols, n)
}

fn pq(path: &Path, e: parquet::errors::ParquetError) -> Error {
    Error::harness(format!("{}: parquet: {e}", path.display()))
}

fn write_file(path: &Path, schema: &str, cols: Vec<Col>) -> Result<()> {
    let schema = Arc::new(parse_message_type(schema).map_err(|e| pq(path, e))?);
    let props = Arc::new(
        WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .build(),
    );
    let file = File::create(path).map_err(|e| Error::io(path, e))?;
    let mut writer = SerializedFileWriter::new(file, schema, props).map_err(|e| pq(path, e))?;
    let mut rg = writer.next_row_group().map_err(|e| pq(path, e))?;
    for col in &cols {
        let mut cw = rg.next_column().map_err(|e| pq(path, e))?.ok_or_else(|| {
            Error::harness(format!("{}: schema has fewer columns", path.display()))
        })?;
        match col {
            Col::Str(v) => cw.typed::<ByteArrayType>().write_batch(v, None, None),
            Col::I32(v) => cw.typed::<Int32Type>().write_batch(v, None, None),
            Col::F64(v) => cw.typed::<DoubleType>().write_batch(v, None, None),
            Col::Bool(v) => cw.typed::<BoolType>().write_batch(v, None, None),
        }
        .map_err(|e| pq(path, e))?;
        cw.close().map_err(|e| pq(path, e))?;
    }
    rg.close().map_err(|e| pq(path, e))?;
    writer.close().map_err(|e| pq(path, e))?;
    Ok(())
}

/// Rows in a Parquet file, from its footer.
pub fn read_row_count(path: &Path) -> Result<i64> {
    let f = File::open(path).map_err(|e| Error::io(path, e))?;
    let r = SerializedFileReader::new(f).map_err(|e| pq(path, e))?;
    Ok(r.metadata().file_metadata().num_rows())
}
