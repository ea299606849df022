//! From scored digits to metrics: log-prob, rank, margin, the first flip,
//! the reference's KL and flips, the least certain positions; the
//! per-digit Parquet rows; the sampling forecast checked against seeded
//! sampled recitations.

use super::*;

/// The `.qgref` header of a reference's rows at the units' positions.
pub(crate) fn tf_rows_header(
    cx: &RunContext,
    ref_alias: &str,
    stream: &str,
    settings: &Settings,
    unit_of_row: &BTreeMap<usize, usize>,
    n_vocab: usize,
) -> Result<CacheHeader> {
    let ref_sha = cx.pinned_sha256(ref_alias)?;
    let rows_wanted: Vec<usize> = unit_of_row.keys().copied().collect();
    Ok(rows_header(
        ref_sha,
        stream,
        format!("teacher-forcing rows {rows_wanted:?}"),
        settings,
        cx.identity_of(ref_alias),
        DEFAULT_TAIL,
        DEFAULT_MAX_KEPT,
        rows_wanted.len(),
        n_vocab,
    ))
}

/// The builder of a reference's rows at the units' positions.
pub(crate) fn tf_rows_build(
    header: CacheHeader,
    window: &Window,
    unit_of_row: &BTreeMap<usize, usize>,
    reference: &dyn LoadedModel,
) -> RowsBuild {
    let wanted = unit_of_row
        .keys()
        .map(|&pos| (0, pos, window.tokens[pos + 1] as usize))
        .collect();
    let ri = reference.info();
    RowsBuild::new(
        header,
        wanted,
        (DEFAULT_TAIL, DEFAULT_MAX_KEPT),
        ri.n_vocab,
        ri.tokenizer_fingerprint.clone(),
    )
}

/// The reference's rows at the units' positions, through the reference store.
#[allow(clippy::too_many_arguments)]
pub(crate) fn tf_reference(
    cx: &RunContext,
    case: &Case,
    t: &TeacherForcing,
    model: &dyn LoadedModel,
    (ref_alias, ref_at): &(String, Location),
    settings: &Settings,
    window: &Window,
    unit_of_row: &BTreeMap<usize, usize>,
    stream: &str,
) -> Result<Arc<RefRows>> {
    let ci = model.info();
    let header = tf_rows_header(cx, ref_alias, stream, settings, unit_of_row, ci.n_vocab)
        .map_err(|e| e.context(ref_at))?;
    let at = (ref_alias.as_str(), ref_at);
    cx.references
        .rows(&header, &case.path, at, Vocab::of(ci), &|| {
            let (_, rmodel) = cx.load_reference(at, Vocab::of(ci))?;
            let rloc = locate(cx, &*rmodel, t, case)?;
            let rids: Vec<TokenId> = rloc.tokens.iter().map(|t| t.id).collect();
            if rids != window.tokens {
                return Err(Error::input(format!(
                    "{ref_at}: reference: `{ref_alias}` and `{}` do not score identical tokens \
                 ({} vs {} tokens)",
                    ci.file.alias,
                    rids.len(),
                    window.tokens.len()
                )));
            }
            let obs = Observation::new(rmodel.clone(), settings.clone(), vec![window.clone()]);
            tf_rows_build(header.clone(), window, unit_of_row, &*rmodel).decode(&obs)
        })
}

pub(crate) fn tf_metrics(
    t: &TeacherForcing,
    loc: &Located,
    rows: &mut [DigitRow],
    with_ref: bool,
    out: &mut Outcome,
) {
    let measured: Vec<&DigitRow> = rows.iter().filter(|r| r.token_index >= 0).collect();
    let n = rows.len();
    let own = rows.iter().filter(|r| r.own_token).count();
    let prefix = loc.tokens.len() >= loc.prompt_ids.len()
        && loc
            .tokens
            .iter()
            .zip(&loc.prompt_ids)
            .all(|(a, &b)| a.id == b);
    // A unit without a token of its own stops the first-flip walk: its
    // recitation cannot be compared token for token.
    let first_flip = rows
        .iter()
        .position(|r| !r.own_token || r.rank > 0)
        .unwrap_or(n);
    let m = &mut out.metrics;
    m.insert("units".into(), n as f64);
    m.insert("units_measured".into(), measured.len() as f64);
    m.insert("own_token_units".into(), own as f64);
    m.insert("all_own_tokens".into(), f64::from(u8::from(own == n)));
    m.insert("prompt_tokens_match".into(), f64::from(u8::from(prefix)));
    m.insert("first_flip".into(), first_flip as f64);
    m.insert(
        "flips".into(),
        measured.iter().filter(|r| r.rank > 0).count() as f64,
    );
    if let Some(r) = rows.get(first_flip) {
        if r.token_index >= 0 {
            m.insert("first_flip_margin".into(), r.margin);
        }
    }
    let nm = measured.len() as f64;
    m.insert(
        "logprob_mean".into(),
        measured.iter().map(|r| r.logprob).sum::<f64>() / nm,
    );
    m.insert(
        "p_true_mean".into(),
        measured.iter().map(|r| r.logprob.exp()).sum::<f64>() / nm,
    );
    m.insert(
        "margin_median".into(),
        median(measured.iter().map(|r| r.margin).collect()),
    );
    let mut tx = BTreeMap::new();
    let not_own: Vec<String> = rows
        .iter()
        .filter(|r| !r.own_token)
        .take(10)
        .map(|r| {
            if r.token_index < 0 {
                format!("{} (no token starts there)", r.unit)
            } else {
                format!("{} ({:?})", r.unit, r.piece)
            }
        })
        .collect();
    tx.insert(
        "e0_own_tokens".into(),
        if not_own.is_empty() {
            format!("every unit is its own token ({n} units)")
        } else {
            format!(
                "{} of {n} units are not their own token; first: {}",
                n - own,
                not_own.join(", ")
            )
        },
    );
    if with_ref {
        let kls: Vec<f64> = measured.iter().map(|r| r.kl_vs_ref).collect();
        m.insert("kl_mean".into(), kls.iter().sum::<f64>() / nm);
        m.insert(
            "kl_max".into(),
            kls.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        );
        m.insert("kl_median".into(), median(kls));
        let matches = measured.iter().filter(|r| r.top1_matches_ref).count();
        m.insert("top1_matches_ref".into(), matches as f64);
        m.insert("top1_matches_ref_rate".into(), matches as f64 / nm);
        let ref_first = rows
            .iter()
            .position(|r| !r.own_token || r.ref_margin <= 0.0 || r.ref_margin.is_nan())
            .unwrap_or(n);
        m.insert("ref_first_flip".into(), ref_first as f64);
        m.insert(
            "ref_flips".into(),
            measured.iter().filter(|r| r.ref_margin <= 0.0).count() as f64,
        );
        // Percentile of each position's reference odds (0 = least certain).
        let mut order: Vec<usize> = (0..rows.len())
            .filter(|&k| rows[k].token_index >= 0)
            .collect();
        order.sort_by(|&a, &b| {
            rows[a]
                .ref_margin
                .total_cmp(&rows[b].ref_margin)
                .then(a.cmp(&b))
        });
        let denom = (order.len().max(2) - 1) as f64;
        for (rank, &k) in order.iter().enumerate() {
            rows[k].ref_odds_percentile = 100.0 * rank as f64 / denom;
        }
        let least: Vec<String> = order
            .iter()
            .take(t.least_certain)
            .map(|&k| {
                let r = &rows[k];
                format!(
                    "{k}: ref odds {}, model odds {}, kl {:.3e}",
                    odds(r.ref_margin),
                    odds(r.margin),
                    r.kl_vs_ref
                )
            })
            .collect();
        tx.insert("least_certain_ref".into(), least.join("; "));
    }
    out.texts.extend(tx);
}

/// Odds e^margin as the seed writes them (`0.2x`, `5600x`).
pub(crate) fn odds(margin: f64) -> String {
    let o = margin.exp();
    if o >= 100.0 {
        format!("{o:.0}x")
    } else if o >= 1.0 {
        format!("{o:.2}x")
    } else {
        format!("{o:.3}x")
    }
}

/// The forecast from the teacher-forced chances, and seeded sampled
/// recitations through llama.cpp's sampler chain beside it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn sampling(
    case: &Case,
    t: &TeacherForcing,
    model: &dyn LoadedModel,
    loc: &Located,
    rows: &[DigitRow],
    settings: &Settings,
    out: &mut Outcome,
) -> Result<()> {
    let all_own = rows.iter().all(|r| r.own_token);
    let mut lines = Vec::new();
    for (i, s) in t.samplers.iter().enumerate() {
        if !all_own {
            lines.push(format!(
                "{}: no forecast: not every unit is its own token (see e0_own_tokens)",
                s.name
            ));
            continue;
        }
        let q: Vec<f64> = rows.iter().map(|r| r.p_pick[i]).collect();
        let forecast = forecast::expected_reach(&q);
        out.metrics
            .insert(format!("{}_forecast_reach", s.name), forecast);
        if s.samples == 0 {
            lines.push(format!("{}: forecast reach {forecast:.2}", s.name));
            continue;
        }
        let max_new = t.expected.token_budget();
        // Sampling passes are never padded (the engine decodes them one
        // token at a time); the context only needs the prompt and the budget.
        let plain = Settings {
            n_ctx: (loc.prompt_ids.len() + max_new + 8).div_ceil(256) as u32 * 256,
            ..settings.clone()
        };
        let t0 = Instant::now();
        let seeds: Vec<u32> = (0..s.samples)
            .map(|k| s.seed.wrapping_add(k as u32))
            .collect();
        let mut follows: Vec<Follow> = seeds
            .iter()
            .map(|_| Follow::new(&t.expected, t.template))
            .collect();
        model
            .sample_many(
                &plain,
                &loc.prompt_ids,
                max_new,
                &s.sampler,
                &seeds,
                &mut |k, gen| {
                    let Some(&last) = gen.last() else {
                        return false;
                    };
                    let r = follows[k].push(&piece_text(model, last));
                    r.complete || r.departs_at.is_some()
                },
            )
            .map_err(|e| e.context(case.path.display()))?;
        let reached: Vec<f64> = follows.iter().map(|f| f.reach().correct as f64).collect();
        out.timings.decode += t0.elapsed();
        let n = reached.len() as f64;
        let mean = reached.iter().sum::<f64>() / n;
        let var = reached.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
        let se = (var / n).sqrt();
        out.metrics
            .insert(format!("{}_sampled_reach_mean", s.name), mean);
        out.metrics
            .insert(format!("{}_sampled_reach_se", s.name), se);
        out.metrics.insert(format!("{}_samples", s.name), n);
        // The survival curve at a few depths: forecast beside observed.
        let surv = forecast::survival(&q);
        let at: Vec<String> = [1usize, 5, 20]
            .iter()
            .filter(|&&k| k < surv.len())
            .map(|&k| {
                let seen = reached.iter().filter(|&&r| r >= k as f64).count();
                format!("P(≥{k}) {:.3} vs {seen}/{}", surv[k], reached.len())
            })
            .collect();
        lines.push(format!(
            "{}: forecast reach {forecast:.2}, sampled {mean:.2} ± {se:.2} (n = {}, seeds {}..{}); {}",
            s.name,
            s.samples,
            s.seed,
            s.seed.wrapping_add(s.samples as u32 - 1),
            at.join(", ")
        ));
    }
    out.texts.insert("sampling".into(), lines.join("; "));
    Ok(())
}
