// A function's output as the console (app.js) shows it: its lines as
// plover logs prints them, escaped as it escapes them, in a pane that
// keeps the last of them; no network.

// The output pane keeps a function's last lines: twice what the server
// keeps of it (funclog.RingLines), so that a function printing for hours
// does not fill the tab's memory.
const PANE_LINES = 2000;

// visible escapes what a tenant's line could use to reorder or hide what
// the operator reads, by plover logs' rule (cli/visible.go): controls but
// tab, Unicode format characters (bidi embeddings, overrides, isolates and
// marks, zero-width characters) and the line and paragraph separators.
const HIDDEN = /[\p{Cc}\p{Cf}\p{Zl}\p{Zp}]/gu;
export function visible(s) {
  return s.replace(HIDDEN, (c) => {
    if (c === "\t") return c;
    const r = c.codePointAt(0), hex = (w) => r.toString(16).padStart(w, "0");
    return r < 0x100 ? "\\x" + hex(2) : r > 0xffff ? "\\U" + hex(8) : "\\u" + hex(4);
  });
}

const pad = (n, w = 2) => String(n).padStart(w, "0");

// logText is one line of output as plover logs shows it (cli/logs.go):
// local time, stream[pid] | the line; a note before it of the lines this
// page missed, and after it of the bytes the server cut.
export function logText(j) {
  const t = new Date(j.time);
  const when = isNaN(t) ? String(j.time) : `${t.getFullYear()}-${pad(t.getMonth() + 1)}-${pad(t.getDate())} ${pad(t.getHours())}:${pad(t.getMinutes())}:${pad(t.getSeconds())}.${pad(t.getMilliseconds(), 3)}`;
  const out = [];
  if (j.dropped > 0) out.push(`... ${j.dropped} lines not shown: this page read more slowly than the function printed`);
  out.push(`${when} ${j.stream}[${j.pid}] | ${visible(String(j.line ?? ""))}` + (j.truncated > 0 ? ` [${j.truncated} more bytes cut]` : ""));
  return out;
}

// pane appends lines to pre, one text node each, dropping the oldest past
// PANE_LINES. A reader at the end (within a few pixels) stays at it, once
// for all the lines; one scrolled up to read keeps the lines read in place
// while older ones are dropped above them.
export function pane(pre) {
  return (lines) => {
    if (!lines.length) return;
    const atEnd = pre.scrollHeight - pre.scrollTop - pre.clientHeight <= 8;
    const frag = document.createDocumentFragment();
    for (const l of lines.slice(-PANE_LINES)) frag.append(document.createTextNode(l + "\n"));
    pre.append(frag);
    const drop = pre.childNodes.length - PANE_LINES;
    if (atEnd) {
      for (let n = drop; n > 0; n--) pre.firstChild.remove();
      pre.scrollTop = pre.scrollHeight;
    } else if (drop > 0) {
      const before = pre.scrollHeight;
      for (let n = drop; n > 0; n--) pre.firstChild.remove();
      pre.scrollTop -= before - pre.scrollHeight;
    }
  };
}
