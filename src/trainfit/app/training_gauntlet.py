import marimo

__generated_with = "0.25.2"
app = marimo.App(width="full", app_title="trainfit · Training Gauntlet")


@app.cell
def _():
    # The notebook is layout only: every number comes from trainfit.labs / trainfit.estimate and every
    # table row, chart and report from the same renderers as the CLI (see trainfit.app.views).
    import io
    import json

    import marimo as mo

    import trainfit
    from trainfit import labs
    from trainfit.app import views
    from trainfit.errors import TrainfitError
    from trainfit.engine import METHODS
    from trainfit.frontier import frontier as trainfit_frontier
    from trainfit.report import to_markdown
    from trainfit.report.estimate import estimate_document
    from trainfit.report.frontier import frontier_document
    from trainfit.report.frontier import plot_frontier as plot_trainfit_frontier
    from trainfit.report.plan import plan_document
    from trainfit.report.lab_plots import plot_frontier, plot_memory_stack
    from trainfit.report.labs import frontier_summary, lab_report_markdown
    from trainfit.planner import plan as trainfit_plan
    return (METHODS, TrainfitError, estimate_document, frontier_document, frontier_summary, io, json, labs, mo,
            lab_report_markdown, plan_document, plot_frontier, plot_memory_stack, plot_trainfit_frontier, to_markdown,
            trainfit,
            trainfit_frontier, trainfit_plan, views)


@app.cell
def _(mo):
    mo.md("""
    # 🏋️ Training Gauntlet
    ### Will this training run fit, and which strategy should I use?

    Pick a deployment **track**, **predict** which memory component dominates, move the **batch** slider and
    compare the training **strategies**; then read the **plan** and download it. *Free mode* runs the same
    engine on any catalog model and accelerator. Lab sizes are decimal **MB (10^6 bytes)**; free mode reports
    **GB (10^9 bytes)** and **GiB (2^30 bytes)**.
    """)
    return


@app.cell
def _(mo):
    view = mo.ui.tabs({"① Memory stack": "", "② Batch frontier": "", "③ Plan & report": "",
                       "Free mode: any model × hardware": ""}, label="View")
    return (view,)


@app.cell
def _(TrainfitError, labs, mo, views):
    # The starting track may come from the URL (?track=tinyml): any id or alias the CLI accepts.
    _options = views.track_options()
    _wanted = mo.query_params().get("track") or ""
    track_note = ""
    try:
        _tid = labs.load_lab_data().resolve_track_id(_wanted)
    except TrainfitError as _exc:
        _tid, track_note = next(iter(_options.values())), str(_exc)
    track = mo.ui.radio(_options, value=next(k for k, v in _options.items() if v == _tid),
                        label="**Track**", inline=True)
    return track, track_note


@app.cell
def _(labs, track):
    profile = labs.load_training_profile(track.value)
    return (profile,)


@app.cell
def _(mo, profile, views):
    # Recreated when the track changes: the strategies and the batch range are the track's.
    _strategies = views.strategy_options(profile)
    strategy = mo.ui.dropdown(_strategies, value=next(iter(_strategies)), label="**Strategy**")
    batch = mo.ui.slider(profile.batch_min, profile.batch_max, step=profile.batch_step,
                         value=profile.default_batch_size, show_value=False, include_input=True,
                         label=f"**Batch size** (samples, {profile.batch_min}–{profile.batch_max})")
    return batch, strategy


@app.cell
def _(mo, views):
    prediction = mo.ui.radio(list(views.COMPONENTS), value=None, inline=True,
                             label="**Predict** the dominant memory component of the selected strategy")
    physics = mo.ui.switch(value=False, label="Show the physical model (TrainingMemoryModel) side by side")
    reflection = mo.ui.text_area(placeholder="Your reflection: why this strategy, what would change your mind, "
                                             "what you would measure first…",
                                 label="**Reflection** (goes into the downloaded report)", full_width=True, rows=3)
    return physics, prediction, reflection


@app.cell
def _(batch, labs, profile, strategy):
    # One call gathers everything the views show (the same object the CLI's report renders).
    report = labs.lab_report(profile, strategy_id=strategy.value, batch_size=batch.value)
    selected = next(s for s in report.stacks if s.strategy_id == report.plan.selected_id)
    return report, selected


@app.cell
def _(METHODS, mo, views):
    _models, _hardware = views.model_options(), views.hardware_options()
    free_task = mo.ui.radio(["Memory estimate", "Frontier: largest batch and longest sequence",
                             "Plan: best layouts on N accelerators"], value="Memory estimate", inline=True,
                            label="**Compute**")
    free = mo.ui.dictionary({
        "model": mo.ui.dropdown(_models, value=next(k for k, v in _models.items() if v == "llama-3.1-8b"),
                                label="Model", searchable=True),
        "hardware": mo.ui.dropdown(_hardware, value=next(k for k, v in _hardware.items() if v == "h100"),
                                   label="Accelerator", searchable=True),
        "method": mo.ui.dropdown(views.method_options(list(METHODS)), value=views.DEFAULT_METHOD,
                                 label="Memory method"),
        **views.free_controls(mo),  # the training setup's fields, as `trainfit estimate` offers them
        "gpus": mo.ui.number(start=1, stop=4096, step=1, value=8, label="Accelerators for the plan (N)"),
        "stack": mo.ui.dropdown(views.stack_options(), value=views.stack_options()[0],
                                label="Stack (the layouts it runs; its launch config)"),
    })
    return free, free_task


@app.cell
def _(frontier_summary, io, json, lab_report_markdown, mo, plot_frontier, plot_memory_stack, prediction, physics,
      profile, reflection, report, selected, views):
    # View builders: the layout cell calls only the visible one (charts cost a few hundred ms each).
    # Longer than 100 lines on purpose: a marimo cell shares only what it returns, and the three builders share
    # this cell's inputs and _png.
    def _png(draw, *args):
        return mo.image(io.BytesIO(views.plot_png(draw, *args)), style={"max-width": "1100px", "width": "100%"})

    _p, _plan, _fr = profile, report.plan, report.frontier
    scenario = mo.md(
        f"**{_p.label}** · {_p.workload_label} · model **{_p.model_name}** ({_p.model_params_m:,.6g} M parameters, "
        f"lab figure) on **{_p.hardware_name}** ({_p.memory_capacity_mb:,.0f} MB device memory) · "
        f"track budget **{_p.training_memory_budget_mb:,.6g} MB** · throughput floor "
        f"**{_p.throughput_budget_samples_s:g} samples/s** · quality floor {_p.quality_floor_pct:g} %"
    )

    def stack_view():
        _kind, _text = views.prediction_feedback(prediction.value, selected)
        _figs = views.key_figures([
            ("sel-strategy", "selected strategy", selected.strategy_label),
            ("sel-batch", "batch (samples)", f"{selected.batch_size}"),
            ("sel-total-mb", "total memory (MB)", f"{selected.total_mb:,.2f}"),
            ("sel-budget-mb", "budget (MB)", f"{selected.budget_mb:,.2f}"),
            ("sel-util-pct", "budget used (%)", f"{selected.memory_utilization_pct:.1f}"),
            ("sel-throughput", "throughput (samples/s)", f"{selected.throughput_samples_s:,.2f}"),
            ("sel-dominant", "dominant component", selected.dominant_component),
            ("sel-feasible", "feasible", "yes" if selected.feasible else "no"),
        ], testid="selected-figures")
        _verdict = mo.callout(mo.md("**Fits** the track's memory budget and throughput floor." if selected.feasible
                                    else "**Does not fit:** " + "; ".join(selected.violations)),
                              kind="success" if selected.feasible else "danger")
        _parts = [mo.Html(_figs), _verdict, mo.callout(mo.md(_text), kind=_kind),
                  _png(plot_memory_stack, _p, list(report.stacks)),
                  mo.md("**Every strategy at this batch** (MB = 10^6 bytes; red rows do not fit; the selected one "
                        "is marked blue):"),
                  mo.Html(views.TABLE_CSS + views.stack_table(report.stacks, selected.strategy_id))]
        if physics.value:
            _disagree = [v for v in report.physics if not v.agree]
            _parts += [mo.md(f"**Physical model** — `TrainingMemoryModel` on {_p.hardware_name} "
                             f"({_p.memory_capacity_mb:,.0f} MB) with each strategy's precision, optimizer, "
                             f"checkpointing and trainable fraction; red rows are where the lab heuristic and the "
                             f"physics disagree about what fits ({len(_disagree)} of {len(report.physics)}):"),
                       mo.Html(views.TABLE_CSS + views.physics_table(report.physics))]
            _parts += [mo.md(f"- *{v.strategy_id}*: {v.note}") for v in _disagree]
        return mo.vstack(_parts)

    def frontier_view():
        return mo.vstack([
            mo.Html(views.key_figures([
                ("fr-strategy", "strategy", _fr.strategy_label),
                ("fr-max-feasible", "largest feasible batch",
                 "none" if _fr.max_feasible_batch is None else str(_fr.max_feasible_batch)),
                ("fr-first-infeasible", "first infeasible batch above it",
                 "none" if _fr.first_infeasible_batch is None else str(_fr.first_infeasible_batch)),
                ("fr-current", f"your batch {selected.batch_size}",
                 "feasible" if selected.feasible else "not feasible"),
            ], testid="frontier-figures")),
            mo.md(frontier_summary(_fr) + ". Small batches can fail the throughput floor, large ones the memory "
                  "budget."),
            _png(plot_frontier, _p, _fr),
            mo.accordion({"Every batch of the range (MB = 10^6 bytes, samples/s)":
                          mo.Html(views.TABLE_CSS + views.frontier_table(_fr))}),
        ])

    def plan_view():
        _name = f"training-plan-{_p.track_id}-{_plan.selected_id}-b{_plan.batch_size}"
        _md = lab_report_markdown(report)
        _notes_md, _notes = views.student_notes(prediction.value, selected, reflection.value)
        _json = report.to_dict()
        if _notes:
            _json["student"] = _notes
        _status = (f"Added to the downloads: your prediction and reflection ({len(_notes['reflection'])} characters)."
                   if _notes else "Nothing of yours in the downloads yet: make a prediction or write a reflection.")
        return mo.vstack([
            mo.callout(mo.Html(f'<div data-testid="plan-memo"><strong>Memo.</strong> '
                               f'{views.html.escape(_plan.memo_summary)}</div>'),
                       kind="success" if _plan.feasible else "danger"),
            mo.Html(views.key_figures([
                ("plan-selected", "selected plan", _plan.selected_label),
                ("plan-feasible", "feasible", "yes" if _plan.feasible else "no"),
                ("plan-total-mb", "total memory (MB)", f"{_plan.total_memory_mb:,.2f}"),
                ("plan-dominant", "dominant component", _plan.dominant_component),
                ("plan-max-batch", "largest feasible batch",
                 "none" if _plan.max_feasible_batch is None else str(_plan.max_feasible_batch)),
            ], testid="plan-figures")),
            mo.md(f"- **Training happens at:** {_plan.training_location}\n"
                  f"- **Validation happens at:** {_plan.validation_location}\n"
                  f"- **Convergence risk:** {_plan.convergence_risk}\n"
                  f"- **Hidden cost:** {_plan.hidden_cost}\n"
                  f"- **Deployment handoff:** {_plan.deployment_handoff}\n"
                  f"- **Residual risk:** {_plan.residual_risk}"),
            mo.hstack([
                mo.vstack([mo.md("**Rejected alternatives** (same batch)"),
                           mo.Html('<ul data-testid="rejected">' + "".join(
                               f"<li>{views.html.escape(r)}</li>" for r in _plan.rejected_alternatives) + "</ul>")]),
                mo.vstack([mo.md("**Validation tests** before the handoff"),
                           mo.Html('<ul data-testid="validation-tests">' + "".join(
                               f"<li>{views.html.escape(t)}</li>" for t in _p.validation_tests) + "</ul>")]),
            ], justify="start", gap=4, align="start"),
            reflection,
            mo.Html(f'<span data-testid="notes-status" style="font-size:0.8rem;color:#555">{_status}</span>'),
            mo.hstack([
                mo.download(data=(_md + _notes_md).encode(), filename=f"{_name}.md", mimetype="text/markdown",
                            label="Download the report (markdown)"),
                mo.download(data=(json.dumps(_json, indent=2) + "\n").encode(),
                            filename=f"{_name}.json", mimetype="application/json",
                            label="Download the report (JSON)"),
            ], justify="start"),
            mo.accordion({"The full report (the same markdown as `trainfit lab plan --output markdown`)": mo.md(_md)}),
        ])
    return frontier_view, plan_view, scenario, stack_view


@app.cell
def _(TrainfitError, estimate_document, free, free_task, frontier_document, io, mo, plan_document, to_markdown,
      trainfit, trainfit_frontier, trainfit_plan, plot_trainfit_frontier, views):
    def free_view():
        _v = free.value
        _is_plan = free_task.value.startswith("Plan")
        _shown = views.PLAN_FIELDS if _is_plan else views.FREE_FIELDS
        _rows = [free_task,
                 mo.hstack([free["model"], free["hardware"], free["method"]], justify="start", wrap=True),
                 mo.hstack([free[k] for k in _shown], justify="start", wrap=True)]
        if _is_plan:
            _rows += [mo.hstack([free["gpus"], free["stack"]], justify="start"),
                      mo.md("The planner searches tensor/pipeline/data parallelism, ZeRO stages, checkpointing "
                            "and micro-batching itself.")]
        _controls = mo.vstack(_rows)
        _img = {"max-width": "1100px", "width": "100%"}
        try:
            if free_task.value.startswith("Frontier"):
                _fields = views.setup_fields(_v)
                _f = trainfit_frontier(_v["model"], _v["hardware"], method=views.method_of(_v["method"]), **_fields)
                _result = mo.vstack([mo.image(io.BytesIO(views.plot_png(plot_trainfit_frontier, _f)), style=_img),
                                     mo.Html(f'<div data-testid="free-frontier">'
                                             f'{mo.md(to_markdown(frontier_document(_f))).text}</div>')])
            elif _is_plan:
                _fields = views.setup_fields(_v, views.PLAN_FIELDS)
                _pl = trainfit_plan(_v["model"], _v["hardware"], int(_v["gpus"]), global_batch=_fields.pop("batch"),
                                    method=views.method_of(_v["method"]), stack=_v["stack"], **_fields)
                _parts = [mo.image(io.BytesIO(views.plot_plan_png(_pl)), style=_img)] if _pl.cloud is not None \
                    and _pl.cloud.size else []
                _launch = views.launch_download(_pl)  # the chosen layout as `trainfit plan --emit FILE` writes it
                if _launch is not None:
                    _parts.append(mo.hstack([
                        mo.download(data=_launch["data"], filename=_launch["filename"], mimetype=_launch["mimetype"],
                                    label=f"Launch config ({_pl.stack}): {_launch['filename']}"),
                        mo.md(f"then `{_launch['launcher']}`")], justify="start", wrap=True))
                _result = mo.vstack(_parts + [mo.Html(f'<div data-testid="free-plan">'
                                                      f'{mo.md(to_markdown(plan_document(_pl))).text}</div>')])
            else:
                _e = trainfit.estimate(_v["model"], _v["hardware"], method=views.method_of(_v["method"]), **views.setup_fields(_v))
                _result = mo.vstack([mo.image(io.BytesIO(views.plot_estimate_png(_e)), style=_img),
                                     mo.Html(f'<div data-testid="free-estimate">'
                                             f'{mo.md(to_markdown(estimate_document(_e))).text}</div>')])
        except TrainfitError as _exc:
            _result = mo.callout(mo.Html(f'<div data-testid="free-error"><strong>Cannot compute:</strong> '
                                         f'{views.html.escape(str(_exc))}</div>'), kind="danger")
        return mo.vstack([mo.md("Any catalog model on any catalog accelerator, with the options of "
                                "`trainfit estimate`, `trainfit frontier` and `trainfit plan` "
                                "(sizes in GB = 10^9 bytes and GiB = 2^30 bytes)."), _controls, _result])
    return (free_view,)


@app.cell
def _(batch, free_view, frontier_view, mo, physics, plan_view, prediction, scenario, stack_view, strategy, track,
      track_note, view):
    _tab = view.value or ""
    if _tab.startswith("Free"):
        _body = free_view()
    else:
        _controls = [track, scenario, mo.hstack([strategy, batch], justify="start", gap=2, wrap=True)]
        if _tab.startswith("①"):
            _controls += [mo.hstack([prediction, physics], justify="space-between", wrap=True)]
        if track_note:
            _controls.insert(0, mo.callout(mo.md(f"URL track ignored: {track_note}"), kind="warn"))
        _build = frontier_view if _tab.startswith("②") else plan_view if _tab.startswith("③") else stack_view
        _body = mo.vstack([*_controls, _build()])
    mo.vstack([view, _body])
    return


if __name__ == "__main__":
    app.run()
