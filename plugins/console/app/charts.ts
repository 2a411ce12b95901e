/** Time-series charts with uPlot: one per metric, sized to their card, with an empty state. */
import uPlot from 'uplot';
import { h } from './dom.js';
import { compact } from './format.js';

export interface ChartSeries {
  label: string;
  color: string;
  kind: 'bars' | 'line' | 'area';
  values: (number | null)[];
}

export interface ChartSpec {
  /** Bucket starts, unix ms. */
  times: number[];
  series: ChartSeries[];
  /** The visible time range, unix ms. */
  range: [number, number];
  /** Width of one bucket, unix ms (bars are drawn this wide). */
  bucketMs: number;
  /** Formats a y value for the axis and the legend. */
  format?: (v: number) => string;
  /** Values are amounts, not counts: label fractional ticks too. */
  fractional?: boolean;
  /** Shown over the chart when it has nothing to draw. */
  emptyText?: string;
}

export interface Chart {
  el: HTMLElement;
  destroy(): void;
}

const HEIGHT = 190;
const axisFont = '11px system-ui, -apple-system, "Segoe UI", Roboto, sans-serif';

function alpha(hex: string, a: number): string {
  const n = parseInt(hex.slice(1), 16);
  return `rgba(${(n >> 16) & 255}, ${(n >> 8) & 255}, ${n & 255}, ${a})`;
}

/** Builds the chart once its host is in the document (uPlot measures it). */
export function chart(spec: ChartSpec): Chart {
  const plotHost = h('div', { class: 'chart-plot' });
  const hasData = spec.series.some((s) => s.values.some((v) => v !== null && v !== 0));
  const el = h('div', { class: 'chart' }, plotHost, hasData ? null : h('div', { class: 'chart-empty' }, spec.emptyText ?? 'No data in this period'));
  const fmt = spec.format ?? compact;
  const xs = spec.times.map((t) => t / 1000);
  let plot: uPlot | null = null;
  let observer: ResizeObserver | null = null;
  const bars = uPlot.paths.bars!({ size: [0.7, 48], align: 1 });

  const opts: uPlot.Options = {
    width: 600,
    height: HEIGHT,
    // Room on the right for the last time label, centred on the edge.
    padding: [8, 20, 0, 0],
    cursor: { drag: { x: false, y: false }, points: { size: 6 } },
    legend: { show: true, live: true },
    scales: {
      x: { time: true, range: () => [spec.range[0] / 1000, (spec.range[1]) / 1000] },
      y: {
        range: (_u, _min, max) => [0, max > 0 ? max * 1.1 : 1],
      },
    },
    axes: [
      { stroke: '#64748b', font: axisFont, grid: { stroke: '#eef1f5', width: 1 }, ticks: { stroke: '#e2e8f0', width: 1, size: 4 } },
      {
        stroke: '#64748b',
        font: axisFont,
        size: 52,
        grid: { stroke: '#eef1f5', width: 1 },
        ticks: { show: false },
        values: (_u, ticks) => ticks.map((v) => (spec.fractional || v === Math.trunc(v) || v > 10 ? fmt(v) : '')),
      },
    ],
    series: [
      { label: 'Time' },
      ...spec.series.map((s): uPlot.Series => {
        const defined = s.values.filter((v) => v !== null).length;
        return {
          label: s.label,
          stroke: s.color,
          width: s.kind === 'bars' ? 0 : 2,
          fill: s.kind === 'line' ? undefined : alpha(s.color, s.kind === 'bars' ? 0.85 : 0.12),
          paths: s.kind === 'bars' ? bars : undefined,
          spanGaps: s.kind !== 'bars',
          points: { show: s.kind !== 'bars' && defined > 0 && defined < 30, size: 5, fill: s.color },
          value: (_u, v) => (v === null || v === undefined ? '–' : fmt(v)),
        };
      }),
    ],
  };

  const init = () => {
    if (plot || !el.isConnected) return;
    const width = Math.max(240, plotHost.clientWidth);
    plot = new uPlot({ ...opts, width }, [xs, ...spec.series.map((s) => s.values)] as uPlot.AlignedData, plotHost);
    observer = new ResizeObserver(() => {
      const w = Math.max(240, plotHost.clientWidth);
      if (plot && Math.abs(plot.width - w) > 1) plot.setSize({ width: w, height: HEIGHT });
    });
    observer.observe(plotHost);
  };
  // Wait for the caller to attach it, then draw.
  requestAnimationFrame(init);

  return {
    el,
    destroy() {
      observer?.disconnect();
      plot?.destroy();
      plot = null;
    },
  };
}

/** Chooses a bucket that gives roughly 60–120 points over the span. */
export function bucketFor(spanMs: number): number {
  const min = 60_000;
  const steps = [1, 5, 10, 15, 30, 60, 120, 180, 360, 720, 1440, 2880, 10080].map((m) => m * min);
  const target = spanMs / 90;
  return steps.find((s) => s >= target) ?? steps[steps.length - 1]!;
}

/**
 * The API sends only buckets with data; charts want every bucket in the range, so gaps read as
 * zero requests rather than a line jumping across them.
 */
export function bucketTimes(range: [number, number], bucketMs: number, present: number[]): number[] {
  const start = Math.floor(range[0] / bucketMs) * bucketMs;
  const count = Math.ceil((range[1] - start) / bucketMs);
  if (count <= 0 || count > 3000) return [...present].sort((a, b) => a - b);
  const times = new Set<number>();
  for (let i = 0; i < count; i++) times.add(start + i * bucketMs);
  for (const t of present) times.add(t);
  return [...times].sort((a, b) => a - b);
}
