//! `kind = "multiple_choice"`: tasks of a question and its choices, scored
//! exactly as `llama-perplexity --multiple-choice` scores its binary task
//! file (ARC, MMLU, TruthfulQA as llama.cpp ships them): each choice is
//! tokenized as `question + " " + choice` (BOS as the model adds it), the
//! tokens all choices share are decoded once for all of them as one
//! sequence prefix, and a choice's score is the mean log-probability of its
//! tokens after that prefix; the highest score is the answer.
//!
//! Contract: the same batches as the tool (as many tasks as fit in
//! 4 × n_ctx tokens and 4 sequences, a unified KV cache), the same float
//! arithmetic, so accuracy and every task's choice equal the tool's on the
//! same file (`tests/real_engine/llama_perplexity.rs`). With a reference model: answer
//! agreement, flips right → wrong and wrong → right with McNemar's exact
//! test, and changed answers binned by the reference's margin. A task that
//! cannot be scored (no question, fewer than 2 choices, no correct choice,
//! longer than the context) is an error naming the file and task, never a
//! task counted as wrong. A model's scores of a task file are kept in the
//! reference store ([`kept_scores`]), whichever role it plays: a reference
//! is scored once for all its candidates.

use crate::core::case::{Metric, Pin};
use crate::core::error::{Error, Result};
use crate::core::outcome::{Column, Table};
use crate::core::parse::{case_table, parse_toml, Diagnostics};
use crate::core::present::{Cell, Field, Join, Metrics, Presentation, ReportColumn};
use crate::core::{Case, Outcome, Settings};
use crate::engine::{BosPolicy, LoadedModel, SeqToken, TokenId};
use crate::execute::reference::Vocab;
use crate::execute::RunContext;
use crate::kinds::scored_text::PinnedFile;
use crate::kinds::{Kind, Start};
use crate::measure::stats::{mcnemar_exact, wilson95};
use std::sync::Arc;
use std::time::Instant;
use toml::Spanned;

mod formats;
pub use formats::*;
mod synthetic;
pub use synthetic::*;
mod scoring;
pub use scoring::*;
mod sequential;
use sequential::Sides;

/// One task: the question, its choices, which are correct (1).
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    /// The question (or context to continue).
    pub question: String,
    /// The choices.
    pub choices: Vec<String>,
    /// 1 for a correct choice, else 0.
    pub labels: Vec<i32>,
}

/// The sequences of one decode that llama-perplexity allows: `-np 4`.
pub(crate) const N_SEQ: usize = 4;

/// A task file's format, as llama-perplexity reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `--multiple-choice`: the binary format (ARC, MMLU, TruthfulQA).
    MultipleChoice,
    /// `--hellaswag`: 6 lines per task (context, gold index, 4 endings).
    Hellaswag,
    /// `--winogrande`: a CSV of sentences with a blank and two choices.
    Winogrande,
    /// Our own, for hand-written suites: one JSON object per line,
    /// `{"question": …, "choices": […], "answer": k}` (k counts from 0),
    /// scored as `--multiple-choice` scores a task.
    Jsonl,
}

/// A `kind = "multiple_choice"` case.
#[derive(Debug, Clone)]
pub(crate) struct MultipleChoice {
    /// The task file's format.
    pub format: Format,
    /// The pinned task file.
    pub file: Pin,
    /// How many tasks (0: all), chosen as the tool chooses them.
    pub tasks: usize,
    /// The count the case asked for, when it named one: more than the file
    /// holds is an error (the tool's own default, 400 HellaSwag tasks,
    /// takes all of a smaller file).
    pub tasks_given: Option<usize>,
    /// The tool's `-c`: the context holds `N_SEQ` times this.
    pub n_ctx: u32,
    /// Upper edges of the reference-margin bins, increasing in (0, 1).
    pub margin_bins: Vec<f64>,
    /// A reference model.
    pub reference: Option<(String, crate::core::Location)>,
    /// Whether the case decides its gates sequentially (`[decide]`).
    pub sequential: bool,
}

case_table! {
    struct McFile {
        tasks_file: Spanned<PinnedFile>,
        format: Option<Spanned<String>>,
        tasks: Option<usize>,
        n_ctx: Option<Spanned<u32>>,
        margin_bins: Option<Spanned<Vec<f64>>>,
    }
}

/// Parse the kind's keys.
pub fn parse(case: &Case, src: &str, diag: &mut Diagnostics) -> Result<Arc<dyn Kind>> {
    let f: McFile = parse_toml(diag.path(), src)?;
    let file = f.tasks_file.get_ref().pin("tasks_file", case, diag);
    let format = crate::core::parse::choice(
        f.format.as_ref(),
        "format",
        &[
            ("multiple-choice", Format::MultipleChoice),
            ("hellaswag", Format::Hellaswag),
            ("winogrande", Format::Winogrande),
            ("jsonl", Format::Jsonl),
        ],
        diag,
    );
    let n_ctx = f.n_ctx.as_ref().map_or(512, |n| *n.get_ref());
    if let Some(n) = f.n_ctx.as_ref().filter(|n| *n.get_ref() < 8) {
        diag.push_at(n.span().start, "n_ctx: must be ≥ 8");
    }
    let margin_bins = f
        .margin_bins
        .as_ref()
        .map_or(vec![0.1, 0.3, 0.6], |b| b.get_ref().clone());
    let ok = margin_bins.iter().all(|x| *x > 0.0 && *x < 1.0)
        && margin_bins.windows(2).all(|w| w[0] < w[1]);
    if !ok {
        diag.push_at(
            f.margin_bins.as_ref().map_or(0, |b| b.span().start),
            format!(
                "margin_bins: {margin_bins:?} must be increasing numbers strictly between 0 and 1"
            ),
        );
    }
    Ok(Arc::new(MultipleChoice {
        format,
        file,
        // The tool's defaults: every task, and 400 HellaSwag tasks.
        tasks: f
            .tasks
            .unwrap_or(if format == Format::Hellaswag { 400 } else { 0 }),
        tasks_given: f.tasks.filter(|&k| k > 0),
        n_ctx,
        margin_bins,
        reference: case.reference.clone(),
        sequential: case.decide.is_some(),
    }))
}

impl MultipleChoice {
    fn settings(&self, threads: u32, options: &crate::core::EngineOptions) -> Settings {
        let n_ctx = self.n_ctx * N_SEQ as u32;
        let mut s = Settings::new(n_ctx, threads).with_options(options);
        s.n_batch = 2048.min(n_ctx);
        s.n_ubatch = 512.min(s.n_batch);
        s.n_seq = N_SEQ as u32;
        s
    }

    fn metric_names(&self) -> Vec<String> {
        let mut m: Vec<String> = [
            "tasks",
            "correct",
            "accuracy",
            "accuracy_se",
            "accuracy_wilson95_lo",
            "accuracy_wilson95_hi",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if self.reference.is_some() {
            for s in [
                "ref_correct",
                "ref_accuracy",
                "agreement",
                "flips_right_to_wrong",
                "flips_wrong_to_right",
                "mcnemar_p",
            ] {
                m.push(s.into());
            }
            for b in 0..=self.margin_bins.len() {
                for s in [
                    "n",
                    "changed",
                    "right_to_wrong",
                    "changed_rate",
                    "changed_rate_wilson95_lo",
                    "changed_rate_wilson95_hi",
                ] {
                    m.push(format!("margin_bin{b}_{s}"));
                }
            }
        }
        m
    }
}

const COUNTS: &[&str] = &[
    "tasks",
    "correct",
    "ref_correct",
    "flips_right_to_wrong",
    "flips_wrong_to_right",
];

/// The flips cell: `right→wrong / wrong→right` against the reference.
fn flips_cell(m: &Metrics) -> Option<String> {
    let (a, b) = (
        m.get("flips_right_to_wrong")?,
        m.get("flips_wrong_to_right")?,
    );
    Some(format!("{a:.0} / {b:.0}"))
}

/// The sequence at the stop of a sequential case's gated `metric`, where a
/// row has it.
fn sequence_column(title: &'static str, metric: &'static str) -> ReportColumn {
    let (lo, hi) = match metric {
        "accuracy" => ("accuracy_seq_lo", "accuracy_seq_hi"),
        _ => ("agreement_seq_lo", "agreement_seq_hi"),
    };
    ReportColumn::new(
        title,
        Cell::Interval {
            metric,
            lo,
            hi,
            digits: 1,
            scale: 100.0,
            signed: false,
            suffix: "%",
        },
    )
    .optional()
}

/// How multiple-choice cases show in the ladder report (a model card's
/// task accuracy): accuracy with its Wilson interval, the answers that
/// flipped against the reference both ways, and McNemar's exact p of them.
pub(crate) fn present() -> Option<Presentation> {
    Some(Presentation {
        kind: "multiple_choice",
        join: Join::Reference,
        columns: vec![
            ReportColumn::new(
                "MC accuracy % [Wilson 95%]",
                Cell::Interval {
                    metric: "accuracy",
                    lo: "accuracy_wilson95_lo",
                    hi: "accuracy_wilson95_hi",
                    digits: 1,
                    scale: 100.0,
                    signed: false,
                    suffix: "%",
                },
            )
            .headline(),
            ReportColumn {
                title: "MC flips right→wrong / wrong→right",
                cell: Cell::Text(flips_cell),
                csv: vec![
                    (
                        "flips_right_to_wrong",
                        Field::Metric("flips_right_to_wrong"),
                    ),
                    (
                        "flips_wrong_to_right",
                        Field::Metric("flips_wrong_to_right"),
                    ),
                ],
                optional: false,
                headline: false,
            },
            ReportColumn::new(
                "MC McNemar p",
                Cell::Number {
                    metric: "mcnemar_p",
                    digits: 3,
                    scale: 1.0,
                },
            ),
            // A sequential case's (shown only where a row has them).
            ReportColumn::new(
                "MC tasks used",
                Cell::OutOf {
                    part: "tasks",
                    whole: "tasks_total",
                },
            )
            .optional(),
            sequence_column("MC accuracy % [sequence at stop]", "accuracy"),
            sequence_column("MC agreement % [sequence at stop]", "agreement"),
        ],
        plots: Vec::new(),
        legend: vec![
            "MC: a multiple-choice case's tasks answered right (Wilson 95% interval); flips: \
             tasks the reference answers right and the model wrong / the other way; McNemar p: \
             the exact two-sided test that the two kinds of flip are equally likely.",
        ],
        align: None,
        hub: vec![crate::core::present::HubMetric {
            metric: "accuracy",
            hub_type: "accuracy",
            name: "MC accuracy",
        }],
        reference: vec![],
        unit: Some("tasks"),
    })
}

/// What a reader calls a multiple-choice case's metrics, and their units.
pub(crate) const MC_ABOUT: crate::core::case::About = &[
    ("tasks", "tasks", "tasks"),
    ("correct", "tasks answered right", "tasks"),
    ("accuracy", "MC accuracy", ""),
    ("accuracy_se", "MC accuracy standard error", ""),
    (
        "accuracy_wilson95_lo",
        "MC accuracy, Wilson 95% lower bound",
        "",
    ),
    (
        "accuracy_wilson95_hi",
        "MC accuracy, Wilson 95% upper bound",
        "",
    ),
    ("ref_correct", "tasks the reference answers right", "tasks"),
    ("ref_accuracy", "the reference's MC accuracy", ""),
    ("agreement", "MC agreement with the reference", ""),
    ("flips_right_to_wrong", "MC flips right→wrong", "tasks"),
    ("flips_wrong_to_right", "MC flips wrong→right", "tasks"),
    ("mcnemar_p", "MC McNemar p", ""),
];

impl Kind for MultipleChoice {
    fn about(&self) -> crate::core::case::About {
        MC_ABOUT
    }

    fn metrics(&self) -> Vec<Metric> {
        self.metric_names()
            .into_iter()
            .map(|n| {
                let count = COUNTS.contains(&n.as_str())
                    || (n.starts_with("margin_bin")
                        && (n.ends_with("_n")
                            || n.ends_with("_changed")
                            || n.ends_with("_right_to_wrong")));
                if count {
                    Metric::count(n)
                } else {
                    Metric::float(n)
                }
            })
            .collect()
    }

    fn headline(&self) -> Vec<&'static str> {
        vec![
            "accuracy",
            "accuracy_wilson95_lo",
            "accuracy_wilson95_hi",
            "tasks",
            "agreement",
            "flips_right_to_wrong",
            "flips_wrong_to_right",
            "mcnemar_p",
        ]
    }

    fn pins(&self) -> Vec<Pin> {
        vec![self.file.clone()]
    }

    fn decides_sequentially(&self) -> bool {
        self.sequential
    }

    fn sequential_metrics(&self) -> Vec<&'static str> {
        if self.reference.is_some() {
            vec!["accuracy", "agreement"]
        } else {
            vec!["accuracy"]
        }
    }

    fn sequential_unit(&self) -> &'static str {
        "task"
    }

    /// About a row per 4 bytes of the task file (every ending is scored
    /// after its context), for the candidate and the reference; read from
    /// the file's size, 0 when it cannot be read (the run says why).
    fn weight(&self) -> usize {
        let bytes = std::fs::metadata(&self.file.path).map_or(0, |m| m.len() as usize);
        bytes / 4 * (1 + usize::from(self.reference.is_some()))
    }

    fn start(&self, cx: &RunContext, case: &Case, alias: &str, out: &mut Outcome) -> Result<Start> {
        let t = Instant::now();
        let shown = self.file.path.display().to_string();
        let bytes = self.file.read_bytes()?;
        let wino = match self.format {
            Format::Winogrande => Some(read_winogrande(&bytes, self.tasks, &shown)?),
            _ => None,
        };
        let tasks = match (self.format, &wino) {
            (Format::MultipleChoice, _) => read_binary(&bytes, self.tasks, &shown)?,
            (Format::Hellaswag, _) => read_hellaswag(&bytes, self.tasks, &shown)?,
            (Format::Jsonl, _) => read_jsonl(&bytes, self.tasks, &shown)?,
            (Format::Winogrande, w) => w.iter().flatten().map(|(i, t)| (*i, t.task())).collect(),
        };
        // Fewer drawn than asked for: the file holds fewer (all were taken).
        if let Some(k) = self.tasks_given.filter(|&k| k > tasks.len()) {
            return Err(Error::input(format!(
                "{}: tasks = {k}, but {shown} holds {} tasks: give at most {}, or leave \
                 `tasks` out to score all of them",
                case.path.display(),
                tasks.len(),
                tasks.len()
            )));
        }
        // A model's scores of the tool's batches `only` (all when None).
        let part = |m: &dyn LoadedModel, settings: &Settings, only: Option<&[usize]>| match &wino {
            Some(w) => score_winogrande_part(m, settings, w, &shown, only),
            None => score_part(m, settings, &tasks, self.format, &shown, only),
        };
        let score = |m: &dyn LoadedModel, settings: &Settings| -> Result<_> {
            Ok(part(m, settings, None)?.0)
        };
        let (verified, model) = cx.load(alias)?;
        out.timings.prepare = t.elapsed();
        out.model_sha256 = Some(verified.file.sha256.clone());
        let settings = self.settings(cx.threads, cx.options());
        out.settings = Some(settings.clone());
        if let Some(decide) = &case.decide {
            let sides = Sides {
                model: &model,
                model_sha256: &verified.file.sha256,
                settings: &settings,
                part: &part,
            };
            self.decide_sequentially(cx, case, decide, &tasks, sides, out)?;
            return Ok(Start::Done);
        }
        let t = Instant::now();
        // Both models' scores through the reference store: a reference
        // scored for one candidate (or a model scored by another case or
        // test) is not scored again.
        let build = cx.identity_of(alias);
        let of = |model_sha256, build| ScoresId {
            model_sha256,
            build,
            file_sha256: &self.file.sha256,
            format: self.format,
            tasks: self.tasks,
            settings: &settings,
        };
        let kept = kept_scores(&cx.references, &of(&verified.file.sha256, &build), &|| {
            Ok(KeptScores::of(&*model, score(&*model, &settings)?))
        })
        .map_err(|e| e.context(case.path.display()))?;
        let scores = &kept.scores;
        let refs = match &self.reference {
            Some((r, at)) => {
                let pinned = cx.pinned_sha256(r).map_err(|e| e.context(at))?;
                let rbuild = cx.identity_of(r);
                let kept = kept_scores(&cx.references, &of(&pinned, &rbuild), &|| {
                    let (_, rmodel) = cx.load_reference((r, at), Vocab::of(model.info()))?;
                    Ok(KeptScores::of(&*rmodel, score(&*rmodel, &settings)?))
                })?;
                self.same_vocab(r, at, &kept, &model)?;
                Some(kept)
            }
            None => None,
        };
        let refs = refs.as_ref().map(|k| &k.scores);
        out.timings.decode = t.elapsed();
        self.conclude(&tasks, scores, refs, out);
        Ok(Start::Done)
    }
}

impl MultipleChoice {
    /// The metrics and rows of `tasks` scored `scores` (and, against a
    /// reference, `refs`): accuracy, agreement, flips both ways with
    /// McNemar's test, changed answers by the reference's margin.
    fn conclude(
        &self,
        tasks: &[(usize, Task)],
        scores: &Scores,
        refs: Option<&Scores>,
        out: &mut Outcome,
    ) {
        // Each task's pick, and whether it is a correct choice.
        let verdicts = |scores: &Scores| -> (Vec<usize>, Vec<bool>) {
            let chosen: Vec<usize> = scores.iter().map(|s| pick(self.format, s)).collect();
            let right = tasks
                .iter()
                .zip(&chosen)
                .map(|((_, t), &c)| t.labels[c] == 1)
                .collect();
            (chosen, right)
        };
        let (chosen, right) = verdicts(scores);
        let n = tasks.len();
        let k = right.iter().filter(|r| **r).count();
        let m = &mut out.metrics;
        let p = k as f64 / n as f64;
        let (lo, hi) = wilson95(k, n);
        m.insert("tasks".into(), n as f64);
        m.insert("correct".into(), k as f64);
        m.insert("accuracy".into(), p);
        m.insert(
            "accuracy_se".into(),
            (p * (1.0 - p) / (n as f64 - 1.0)).sqrt(),
        );
        m.insert("accuracy_wilson95_lo".into(), lo);
        m.insert("accuracy_wilson95_hi".into(), hi);
        let mut columns: Vec<(String, Column)> = vec![
            (
                "task".into(),
                Column::I32(tasks.iter().map(|(i, _)| *i as i32).collect()),
            ),
            (
                "chosen".into(),
                Column::I32(chosen.iter().map(|c| *c as i32).collect()),
            ),
            ("correct".into(), Column::Bool(right.clone())),
            (
                "logprobs".into(),
                Column::Str(scores.iter().map(|s| format!("{s:?}")).collect()),
            ),
            (
                "margin".into(),
                Column::F64(scores.iter().map(|s| margin(s)).collect()),
            ),
        ];
        if let Some(refs) = &refs {
            let (rchosen, rright) = verdicts(refs);
            let b = rright
                .iter()
                .zip(&right)
                .filter(|(r, c)| **r && !**c)
                .count() as u64;
            let c = rright
                .iter()
                .zip(&right)
                .filter(|(r, c)| !**r && **c)
                .count() as u64;
            let agree = rchosen.iter().zip(&chosen).filter(|(a, b)| a == b).count();
            m.insert(
                "ref_correct".into(),
                rright.iter().filter(|r| **r).count() as f64,
            );
            m.insert(
                "ref_accuracy".into(),
                rright.iter().filter(|r| **r).count() as f64 / n as f64,
            );
            m.insert("agreement".into(), agree as f64 / n as f64);
            m.insert("flips_right_to_wrong".into(), b as f64);
            m.insert("flips_wrong_to_right".into(), c as f64);
            m.insert("mcnemar_p".into(), mcnemar_exact(b, c));
            let rmargin: Vec<f64> = refs.iter().map(|s| margin(s)).collect();
            for bin in 0..=self.margin_bins.len() {
                let lo = if bin == 0 {
                    0.0
                } else {
                    self.margin_bins[bin - 1]
                };
                let hi = self.margin_bins.get(bin).copied().unwrap_or(f64::INFINITY);
                let idx: Vec<usize> = (0..n)
                    .filter(|&i| rmargin[i] >= lo && rmargin[i] < hi)
                    .collect();
                let changed = idx.iter().filter(|&&i| rchosen[i] != chosen[i]).count();
                let r2w = idx.iter().filter(|&&i| rright[i] && !right[i]).count();
                m.insert(format!("margin_bin{bin}_n"), idx.len() as f64);
                m.insert(format!("margin_bin{bin}_changed"), changed as f64);
                m.insert(format!("margin_bin{bin}_right_to_wrong"), r2w as f64);
                if !idx.is_empty() {
                    let (wl, wh) = wilson95(changed, idx.len());
                    m.insert(
                        format!("margin_bin{bin}_changed_rate"),
                        changed as f64 / idx.len() as f64,
                    );
                    m.insert(format!("margin_bin{bin}_changed_rate_wilson95_lo"), wl);
                    m.insert(format!("margin_bin{bin}_changed_rate_wilson95_hi"), wh);
                }
            }
            columns.push((
                "ref_chosen".into(),
                Column::I32(rchosen.iter().map(|c| *c as i32).collect()),
            ));
            columns.push(("ref_correct".into(), Column::Bool(rright)));
            columns.push((
                "ref_logprobs".into(),
                Column::Str(refs.iter().map(|s| format!("{s:?}")).collect()),
            ));
            columns.push(("ref_margin".into(), Column::F64(rmargin)));
        }
        out.rows = Some(Arc::new(Table {
            name: "mc_task",
            columns,
        }));
    }
}

#[cfg(test)]
mod tests;
