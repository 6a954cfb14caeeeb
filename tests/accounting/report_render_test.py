"""Tests for `dp_ftrl_tff.accounting.report_render`'s plots: integer round ticks, plain labels on
log axes, legends outside the axes, a distinct (colour, marker) per line, the run's row beneath."""

import numpy as np
import pytest
from matplotlib import colors, figure, ticker

from dp_ftrl_tff import plan
from dp_ftrl_tff.accounting import equal_privacy as equal_privacy_lib
from dp_ftrl_tff.accounting import report, report_render, zcdp_epsilon
from dp_ftrl_tff.mechanisms import gaussian, tree
from dp_ftrl_tff.mechanisms import participation as participation_lib

pytestmark = pytest.mark.unit

Schema = participation_lib.ParticipationSchema


@pytest.fixture(name='tree_report', scope='module')
def fixture_tree_report():
  """A 4-round tree run (fractional round ticks by matplotlib's default), with its equal-privacy
  table (nine rows, several of them coinciding)."""
  run_plan = plan.RunPlan.for_accounting(tree.TreeStrategy('vanilla'), 1.0, num_rounds=4,
                                         participation=Schema(1, 4))
  return report.build_report(run_plan, equal_privacy=True)


@pytest.fixture(name='figures', scope='module')
def fixture_figures(tree_report, tmp_path_factory):
  """{file name: (figure, savefig keyword arguments)} of `write_plots(tree_report)`."""
  saved = {}
  savefig = figure.Figure.savefig

  def record(fig, path, **kwargs):
    saved[str(path).rsplit('/', 1)[-1]] = (fig, kwargs)
    return savefig(fig, path, **kwargs)

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(figure.Figure, 'savefig', record)
    report_render.write_plots(tree_report, str(tmp_path_factory.mktemp('plots')))
  assert sorted(saved) == sorted([*report_render.PLOT_FILES, report_render.EQUAL_PRIVACY_PLOT])
  return saved


def _ticks_in_view(ax, which):
  lo, hi = sorted(ax.get_xlim() if which == 'x' else ax.get_ylim())
  ticks = ax.get_xticks() if which == 'x' else ax.get_yticks()
  return [t for t in ticks if lo <= t <= hi]


def _marked_lines(ax):
  return [line for line in ax.get_lines() if line.get_marker() not in (None, '', ' ', 'None')]


def test_round_axes_have_integer_ticks(figures):
  for name in report_render.PLOT_FILES:  # rounds n, then min_sep b (log)
    ax = figures[name][0].axes[0]
    ticks = _ticks_in_view(ax, 'x')
    assert len(ticks) >= 2, name
    assert all(float(t).is_integer() for t in ticks), (name, ticks)


@pytest.mark.parametrize('name, which', [('epsilon_vs_min_sep.png', 'x'),
                                         ('epsilon_vs_min_sep.png', 'y'),
                                         (report_render.EQUAL_PRIVACY_PLOT, 'x'),
                                         (report_render.EQUAL_PRIVACY_PLOT, 'y')])
def test_log_axes_have_plain_labels_up_to_the_top(figures, name, which):
  ax = figures[name][0].axes[0]
  axis = ax.xaxis if which == 'x' else ax.yaxis
  assert axis.get_scale() == 'log'
  ticks = _ticks_in_view(ax, which)
  assert len(ticks) >= 3, ticks
  labels = [axis.get_major_formatter()(t) for t in ticks]
  assert labels == [f'{t:g}' for t in ticks]  # '20', not '2x10^1'
  assert isinstance(axis.get_minor_formatter(), ticker.NullFormatter)
  lo, hi = sorted(ax.get_xlim() if which == 'x' else ax.get_ylim())
  assert np.log(max(ticks) / lo) / np.log(hi / lo) > 0.6  # the upper part is labelled too


@pytest.mark.parametrize('name', ['epsilon_vs_min_sep.png', report_render.EQUAL_PRIVACY_PLOT])
def test_legend_is_right_of_the_axes_and_saved(figures, name):
  fig, kwargs = figures[name]
  ax = fig.axes[0]
  renderer = fig.canvas.get_renderer()
  legend = ax.get_legend()
  assert legend is not None
  assert legend.get_window_extent(renderer).x0 >= ax.get_window_extent(renderer).x1
  assert kwargs.get('bbox_inches') == 'tight'  # the saved image includes it


def test_every_line_has_its_own_colour_and_marker(figures, tree_report):
  for name, (fig, _) in figures.items():
    lines = _marked_lines(fig.axes[0])
    pairs = {(colors.to_hex(line.get_color()), line.get_marker()) for line in lines}
    assert len(pairs) == len(lines) >= 1, name
  lines = _marked_lines(figures[report_render.EQUAL_PRIVACY_PLOT][0].axes[0])
  assert len(lines) == len(tree_report.equal_privacy.rows) == 9
  assert len({colors.to_hex(line.get_color()) for line in lines}) == 9
  # Coinciding rows (here gaussian, banded and BLT) put their markers at different points.
  marked = [set(range(line.get_markevery()[0], len(line.get_xdata()), line.get_markevery()[1]))
            for line in lines]
  assert all(len(m) >= 1 for m in marked)
  assert sum(len(m) for m in marked) == len(set().union(*marked))


def test_run_row_is_drawn_beneath_the_others(figures, tree_report):
  ax = figures[report_render.EQUAL_PRIVACY_PLOT][0].axes[0]
  table = tree_report.equal_privacy
  (run_row,) = [row for row in table.rows if row.run_mechanism]
  run_curve = equal_privacy_lib.loss_against_epsilon(table, tree_report.guarantee.delta)[
      run_row.mechanism]
  lines = [line for line in ax.get_lines() if len(line.get_xdata()) > 2]  # not the axvline
  run_lines = [line for line in lines if np.allclose(line.get_ydata(), run_curve)
               and line not in _marked_lines(ax)]
  other_lines = [line for line in lines if line not in run_lines]
  assert len(run_lines) == 2  # the band and the line
  assert max(line.get_zorder() for line in run_lines) < min(
      line.get_zorder() for line in other_lines)


def test_a_narrow_log_axis_still_gets_labels():
  ax = figure.Figure().subplots()
  ax.plot([1, 2], [46.5, 47.5])
  ax.set_yscale('log')
  report_render._label_log_axis(ax, 'y')  # pylint: disable=protected-access
  assert len(_ticks_in_view(ax, 'y')) >= 2


def test_min_sep_points_beyond_the_pld_are_drawn_with_the_zcdp_bound(tmp_path):
  """DP-SGD over 100 rounds at min_sep 10 and noise 0.5 has rho 20, but rho 200 at min_sep 1 (k =
  100): that point of epsilon_vs_min_sep.png is the zCDP bound (`privacy_report --output_dir` once
  failed on such a point, then left it out)."""
  run_plan = plan.RunPlan.for_accounting(gaussian.GaussianStrategy(), 0.5, num_rounds=100,
                                         participation=Schema(10))
  paths = report_render.write_plots(report.build_report(run_plan), str(tmp_path), num_points=6)
  assert sorted(p.rsplit('/', 1)[-1] for p in paths) == sorted(report_render.PLOT_FILES)
  epsilons = report_render._epsilon_curve(  # pylint: disable=protected-access
      run_plan, lambda b: Schema(int(b)), [1, 10], lambda b: 100)
  assert epsilons[0] == zcdp_epsilon.zcdp_epsilon_bound(200.0) and epsilons[1] < epsilons[0]
