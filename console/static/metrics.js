// Figures from the server's /metrics (Prometheus text), for the console
// (app.js): pure functions of the text, no page or network.

// parseMetrics reads each sample line as {name, labels, value}. The label
// block ends at the first } outside a quoted value (a value may hold } or
// an escaped quote), and the value is the field after it: what follows
// (a timestamp, an OpenMetrics exemplar " # {trace_id=...} 0.05") is not
// read, where a greedy block ran on to the exemplar's } and took its
// value and labels for the sample's.
export function parseMetrics(text) {
  const out = [];
  for (const line of text.split("\n")) {
    if (!line || line[0] === "#") continue;
    const m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{((?:[^"}]|"(?:[^"\\]|\\.)*")*)\})?\s+(\S+)/);
    if (!m) continue;
    const labels = {};
    for (const l of (m[2] || "").matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2].replace(/\\(.)/g, (_, c) => c === "n" ? "\n" : c);
    out.push({ name: m[1], labels, value: sampleValue(m[3]) });
  }
  return out;
}

// sampleValue reads a sample's value (or a bucket's le): the format writes
// infinities +Inf and -Inf, which parseFloat reads as NaN.
export function sampleValue(v) {
  if (v === "+Inf" || v === "Inf") return Infinity;
  if (v === "-Inf") return -Infinity;
  return parseFloat(v); // "NaN" too
}

// histBuckets reads a histogram's series grouped by key(labels) (null:
// left out): for each group its cumulative buckets, [le, count] by le.
export function histBuckets(samples, metric, key) {
  // Keyed by tenants' function names: no prototype (a function named
  // "constructor" would find Object's).
  const groups = Object.create(null);
  for (const s of samples) {
    if (s.name !== metric + "_bucket") continue;
    const k = key(s.labels);
    if (k === null) continue;
    (groups[k] ||= []).push([sampleValue(s.labels.le), s.value]);
  }
  for (const b of Object.values(groups)) b.sort((x, y) => x[0] - y[0]);
  return groups;
}

// bucketQuantiles is p50 and p99 (seconds; null without a request) and the
// count of cumulative buckets b, interpolating inside a bucket as
// Prometheus's histogram_quantile does.
export function bucketQuantiles(b) {
  const total = b.length ? b[b.length - 1][1] : 0;
  const q = (p) => {
    if (!total) return null;
    const rank = p * total;
    let prevLe = 0, prevC = 0;
    for (const [le, c] of b) {
      if (c >= rank) {
        if (le === Infinity) return prevLe;
        return prevLe + (le - prevLe) * (c === prevC ? 0 : (rank - prevC) / (c - prevC));
      }
      prevLe = le; prevC = c;
    }
    return prevLe;
  };
  return { p50: q(0.5), p99: q(0.99), count: total };
}

// histQuantiles reads p50 and p99 of a histogram's series over the
// server's life (its cumulative counts), grouped as histBuckets groups.
export function histQuantiles(samples, metric, key) {
  const res = Object.create(null);
  for (const [k, b] of Object.entries(histBuckets(samples, metric, key))) res[k] = bucketQuantiles(b);
  return res;
}
