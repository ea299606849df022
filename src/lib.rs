#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

pub mod case;
pub mod diff;
pub mod digitcase;
pub mod digits;
pub mod discover;
pub mod engine;
pub mod error;
pub mod execute;
pub mod forecast;
pub mod fsutil;
pub mod gguf;
pub mod golden;
pub mod harness;
pub mod judge;
pub mod kld;
pub mod measure;
pub mod models;
pub mod parquet_out;
pub mod parse;
pub mod plot;
pub mod prereg;
pub mod recitation;
pub mod refcache;
pub mod report;
pub mod runner;
