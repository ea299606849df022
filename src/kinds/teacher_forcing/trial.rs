//! The teacher-forced run: the expected digits located in the prompt's
//! tokens, one window decoded, every digit's row scored as it streams.

use super::*;

/// Rank of the true token (tokens with a strictly higher logit) and its
/// margin (its logit minus the best other's, f64), in one pass.
pub(crate) fn rank_and_margin(row: &[f32], target: usize) -> (i64, f64) {
    let t = row[target];
    let (mut rank, mut best_other) = (0i64, f32::NEG_INFINITY);
    for (j, &v) in row.iter().enumerate() {
        if j != target {
            rank += i64::from(v > t);
            best_other = best_other.max(v);
        }
    }
    (rank, f64::from(t) - f64::from(best_other))
}

/// The reference's margin at a stored position (exact: its top entries
/// are stored with their f32 logits, and the tail's largest logit too).
pub(crate) fn ref_margin(r: &RefPosition, target: u32) -> f64 {
    let best_other = r
        .entries
        .iter()
        .find(|(j, _)| *j != target)
        .map(|&(_, l)| l)
        .or_else(|| r.tail.as_ref().map(|t| t.hi))
        .unwrap_or(f32::NEG_INFINITY);
    r.lp_true - r.lp(best_other)
}

/// The one window of a teacher-forced text, and the row before each
/// located unit's token (row → unit).
pub(crate) fn tf_window(loc: &Located, ids: &[TokenId]) -> (Window, BTreeMap<usize, usize>) {
    let mut unit_of_row: BTreeMap<usize, usize> = BTreeMap::new();
    for (k, (_, tok)) in loc.units.iter().enumerate() {
        if let Some(i) = tok {
            unit_of_row.insert(i - 1, k);
        }
    }
    let first_row = unit_of_row.keys().next().copied().unwrap_or(ids.len() - 1);
    let window = Window {
        tokens: ids.to_vec(),
        logits_from: first_row,
    };
    (window, unit_of_row)
}

/// Start a `teacher_forcing` case: load, locate the units, take the
/// reference's rows from the store; the rows are read by [`TfTrial`].
pub(crate) fn start_teacher_forcing(
    cx: &RunContext,
    case: &Case,
    t: &TeacherForcing,
    alias: &str,
    out: &mut Outcome,
) -> Result<Start> {
    let t0 = Instant::now();
    let (verified, model) = cx.load(alias)?;
    out.timings.prepare = t0.elapsed();
    out.model_sha256 = Some(verified.file.sha256.clone());
    let t0 = Instant::now();
    let loc = locate(cx, &*model, t, case)?;
    let ids: Vec<TokenId> = loc.tokens.iter().map(|t| t.id).collect();
    let stream = ids_sha256(&ids);
    out.token_stream_sha256 = Some(stream.clone());
    out.timings.tokenize = t0.elapsed();
    let settings = settings_for(cx, &*model, case, ids.len(), t.min_rows)?;
    out.settings = Some(settings.clone());
    let (window, unit_of_row) = tf_window(&loc, &ids);
    let t0 = Instant::now();
    let reference = match &t.reference {
        Some(r) => Some(tf_reference(
            cx,
            case,
            t,
            &*model,
            r,
            &settings,
            &window,
            &unit_of_row,
            &stream,
        )?),
        None => None,
    };
    out.timings.decode += t0.elapsed();
    let obs = Observation::new(model.clone(), settings.clone(), vec![window]);
    let n_units = loc.units.len();
    Ok(Start::Observe(
        obs,
        Box::new(TfTrial {
            t: t.clone(),
            case: case.clone(),
            alias: alias.to_string(),
            model,
            settings,
            loc,
            ids,
            unit_of_row,
            reference,
            rows: vec![None; n_units],
        }),
    ))
}

/// A teacher-forcing trial reading the rows of its one pass.
pub(crate) struct TfTrial {
    t: TeacherForcing,
    case: Case,
    alias: String,
    model: Arc<dyn LoadedModel>,
    settings: Settings,
    loc: Located,
    ids: Vec<TokenId>,
    unit_of_row: BTreeMap<usize, usize>,
    reference: Option<Arc<RefRows>>,
    rows: Vec<Option<DigitRow>>,
}

impl Consumer for TfTrial {
    fn wants_exps(&self) -> bool {
        self.reference.is_some()
    }

    /// A unit's row: rank, margin, the comparison with the reference row and
    /// the samplers' chances, on any thread.
    fn map(&self, r: &Row<'_>) -> Result<Mapped> {
        let (pos, row, st) = (r.pos, r.logits, r.stats);
        let Some(&k) = self.unit_of_row.get(&pos) else {
            return Ok(None);
        };
        let target = self.ids[pos + 1] as usize;
        let top = st.argmax;
        let (rank, margin) = rank_and_margin(row, target);
        let (kl, matches, rmargin) = match &self.reference {
            Some(refs) => {
                // The reference holds the units' rows in position order.
                let at = self.unit_of_row.range(..pos).count();
                let rp = &refs.rows[at];
                let c = compare(rp, row, st, r.exps, target, false);
                (c.kl, c.ref_top == top as u32, ref_margin(rp, target as u32))
            }
            None => (f64::NAN, false, f64::NAN),
        };
        let tok = &self.loc.tokens[pos + 1];
        let units = &self.t.expected.units;
        Ok(Some(Box::new(DigitRow {
            unit: k as u32,
            char_offset: self.loc.units[k].0 as u32,
            token_index: (pos + 1) as i32,
            token_id: tok.id,
            piece: String::from_utf8_lossy(&tok.piece).into_owned(),
            own_token: String::from_utf8_lossy(&tok.piece).trim() == units[k],
            logprob: st.logprob(row, target),
            rank,
            margin,
            top1_token: top as TokenId,
            top1_piece: piece_text(&*self.model, top as TokenId),
            kl_vs_ref: kl,
            top1_matches_ref: matches,
            ref_margin: rmargin,
            ref_odds_percentile: f64::NAN,
            p_pick: self
                .t
                .samplers
                .iter()
                .map(|s| forecast::p_pick(row, &s.sampler, target))
                .collect(),
        })))
    }

    fn absorb(&mut self, r: &Row<'_>, m: Mapped) -> Result<()> {
        if let Some(&k) = self.unit_of_row.get(&r.pos) {
            let row = mapped::<DigitRow>(m)
                .ok_or_else(|| Error::harness("a unit's row was not measured"))?;
            self.rows[k] = Some(row);
        }
        Ok(())
    }
}

impl Finish for TfTrial {
    fn finish(self: Box<Self>, _cx: &RunContext, out: &mut Outcome) -> Result<()> {
        let TfTrial {
            t,
            case,
            alias,
            model,
            settings,
            loc,
            unit_of_row,
            reference,
            rows,
            ..
        } = *self;
        let t0 = Instant::now();
        let samplers: Vec<&SamplerSpec> = t.samplers.iter().collect();
        let measured = rows.iter().flatten().count();
        if measured == 0 {
            return Err(Error::input(format!(
                "{}: no unit of the expected text starts a token of `{alias}`: nothing to score \
                 (the tokenizer merges the units with their neighbours)",
                case.path.display()
            )));
        }
        if measured != unit_of_row.len() {
            return Err(Error::harness(format!(
                "{}: scored {measured} of {} located units",
                case.path.display(),
                unit_of_row.len()
            )));
        }
        // A unit without a token of its own keeps a row, with nothing scored.
        let mut rows: Vec<DigitRow> = rows
            .into_iter()
            .enumerate()
            .map(|(k, r)| {
                r.unwrap_or_else(|| DigitRow {
                    unit: k as u32,
                    char_offset: loc.units[k].0 as u32,
                    token_index: -1,
                    token_id: -1,
                    piece: String::new(),
                    own_token: false,
                    logprob: f64::NAN,
                    rank: -1,
                    margin: f64::NAN,
                    top1_token: -1,
                    top1_piece: String::new(),
                    kl_vs_ref: f64::NAN,
                    top1_matches_ref: false,
                    ref_margin: f64::NAN,
                    ref_odds_percentile: f64::NAN,
                    p_pick: vec![f64::NAN; samplers.len()],
                })
            })
            .collect();
        tf_metrics(&t, &loc, &mut rows, reference.is_some(), out);
        out.timings.measure += t0.elapsed();
        if !samplers.is_empty() {
            sampling(&case, &t, &*model, &loc, &rows, &settings, out)?;
        }
        let t0 = Instant::now();
        let rows = DigitRows {
            rows,
            samplers: samplers.iter().map(|s| s.name.clone()).collect(),
            reference: reference.is_some(),
        };
        // The per-digit plot beside the rows.
        let first_flip = out.metrics.get("first_flip").map(|f| *f as usize);
        let title = format!("{}::{alias}", case.name);
        out.artifacts.push(Artifact {
            extension: "svg",
            body: rows.svg(&title, first_flip),
        });
        out.rows = Some(Arc::new(rows.table()));
        out.timings.measure += t0.elapsed();
        Ok(())
    }
}

/// The scored text of a teacher-forced case and where each unit's token is.
pub(crate) struct Located {
    pub(super) tokens: Vec<Token>,
    pub(super) prompt_ids: Vec<TokenId>,
    /// Per unit: (byte offset in the text, token index or None).
    pub(super) units: Vec<(usize, Option<usize>)>,
}

pub(crate) fn locate(
    cx: &RunContext,
    model: &dyn LoadedModel,
    t: &TeacherForcing,
    case: &Case,
) -> Result<Located> {
    let prompt = prompt_text(cx, model, t.template, &t.prompt)?;
    let text = format!("{prompt}{}{}", t.expected.lead, t.expected.body());
    let tokens = tokenize(model, t.template, &text)?;
    let prompt_ids: Vec<TokenId> = tokenize(model, t.template, &prompt)?
        .iter()
        .map(|t| t.id)
        .collect();
    let starts: Vec<usize> = t
        .expected
        .spans()
        .iter()
        .map(|&(a, _)| prompt.len() + a)
        .collect();
    let found = unit_tokens(text.as_bytes(), &starts, &tokens);
    let units = starts
        .into_iter()
        .zip(found)
        .map(|(a, i)| (a, i.filter(|&i| i > 0)))
        .collect();
    if tokens.iter().all(|t| t.offset.is_none()) {
        return Err(Error::harness(format!(
            "{}: the pieces of `{}` do not spell the text; units cannot be located",
            case.path.display(),
            model.info().file.alias
        )));
    }
    Ok(Located {
        tokens,
        prompt_ids,
        units,
    })
}
