// hangdoc's HTML report (hangdoc/report/html.py): draws the merged stack tree, the classes
// of ranks and a rank's own stacks from the JSON object embedded in the page. Written for
// hangdoc; no external code. Everything from the job is set with textContent, never as HTML.
// Nothing is drawn before it is asked for: a branch's DOM is made when it is first opened.
(function () {
  'use strict';
  const D = JSON.parse(document.getElementById('hangdoc-data').textContent);
  const $ = (id) => document.getElementById(id);
  const FOLD_OVER = 14;      // a stretch longer than this shows its ends and a "more" line
  const FOLD_HEAD = 4;
  const FOLD_TAIL = 8;
  const OPEN_BUDGET = 60;    // branches opened when the page loads
  const RESULTS_MAX = 100;   // search results listed
  const SET_LINKS_MAX = 120; // ranks listed as links for a rank set
  const KIDS_SHOWN = 200;    // branches drawn at once below one branch

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }

  // ------------------------------------------------------------------ rank sets
  const parsedSets = new Map();
  function parseRanges(text) {
    const out = [];
    if (!text) return out;
    for (const part of text.split(',')) {
      const dash = part.indexOf('-', 1);
      const a = Number(dash < 0 ? part : part.slice(0, dash));
      const b = dash < 0 ? a : Number(part.slice(dash + 1));
      out.push([a, b]);
    }
    return out;
  }
  function rset(i) {  // the ranges of rank set i, parsed once
    let r = parsedSets.get(i);
    if (!r) {
      r = parseRanges(D.rsets[i]);
      r.count = r.reduce((n, [a, b]) => n + b - a + 1, 0);
      parsedSets.set(i, r);
    }
    return r;
  }
  function inRanges(ranges, rank) {
    let lo = 0, hi = ranges.length - 1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      if (rank < ranges[mid][0]) hi = mid - 1;
      else if (rank > ranges[mid][1]) lo = mid + 1;
      else return true;
    }
    return false;
  }
  function shortText(text, limit) {
    if (text.length <= limit) return text;
    const cut = text.lastIndexOf(',', limit);
    const head = text.slice(0, cut > 0 ? cut : limit);
    return head + ',…+' + (text.slice(head.length).split(',').length - 1);
  }
  function plural(n, word) {
    return n + ' ' + word + (n === 1 ? '' : /(s|sh|ch|x)$/.test(word) ? 'es' : 's');
  }

  // ------------------------------------------------------------------ per-rank columns
  function unruns(runs, n) {
    const out = new Int32Array(n);
    let k = 0;
    for (let i = 0; i < runs.length; i += 2) {
      out.fill(runs[i], k, k + runs[i + 1]);
      k += runs[i + 1];
    }
    return out;
  }
  const rankIds = (function () {
    const ranges = parseRanges(D.ranks.ids);
    const n = ranges.reduce((s, [a, b]) => s + b - a + 1, 0);
    const ids = new Int32Array(n);
    let k = 0;
    for (const [a, b] of ranges) for (let r = a; r <= b; r++) ids[k++] = r;
    return ids;
  })();
  const hostCol = unruns(D.ranks.host, rankIds.length);
  const infoCol = unruns(D.ranks.info, rankIds.length);
  const viewCol = unruns(D.ranks.view, rankIds.length);
  const culpritRanges = D.culprits >= 0 ? rset(D.culprits) : [];
  function rankIndex(rank) {
    let lo = 0, hi = rankIds.length - 1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      if (rankIds[mid] < rank) lo = mid + 1;
      else if (rankIds[mid] > rank) hi = mid - 1;
      else return mid;
    }
    return -1;
  }

  // ------------------------------------------------------------------ frames
  function frameText(fi) {
    const f = D.frames[fi];
    return f[0] + ' (' + f[1] + ')';
  }
  function frameLine(fi, cls) {
    const f = D.frames[fi];
    const lib = f[4] !== 'user';
    const line = el('div', cls + (f[5] ? ' native' : lib ? ' lib' : ''));
    line.textContent = frameText(fi);
    if (f[6] && !lib) line.appendChild(el('span', 'code', f[6]));
    line.title = f[2] + (f[3] ? ':' + f[3] : '') + (f[6] ? '\n' + f[6] : '');
    line.dataset.f = fi;
    return line;
  }

  // ------------------------------------------------------------------ the tree
  const T = D.tree;
  const N = T ? T.frame.length : 0;
  const kids = [];
  for (let n = 0; n < N; n++) kids.push([]);
  for (let n = 1; n < N; n++) if (T.parent[n] >= 0) kids[T.parent[n]].push(n);
  const outlier = new Uint8Array(N);
  const culprit = new Uint8Array(N);
  if (T) {
    for (const n of T.outliers) outlier[n] = 1;
    for (const n of T.culprit) culprit[n] = 1;
  }
  // blocks: maximal unbranched stretches of one rank set, drawn as one branch
  const blockOf = new Int32Array(N).fill(-1);
  const blocks = [];
  (function buildBlocks() {
    if (!N) return;
    const todo = kids[0].slice().reverse().map((n) => [n, -1]);
    while (todo.length) {
      const [start, up] = todo.pop();
      const b = blocks.length;
      const nodes = [start];
      let n = start;
      while (kids[n].length === 1 && T.ranks[kids[n][0]] === T.ranks[n]) {
        n = kids[n][0];
        nodes.push(n);
      }
      blocks.push({ nodes: nodes, parent: up, kids: [], el: null, open: false, drawn: false });
      for (const m of nodes) blockOf[m] = b;
      if (up >= 0) blocks[up].kids.push(b);
      for (let i = kids[n].length - 1; i >= 0; i--) todo.push([kids[n][i], b]);
    }
  })();
  const hasOutlier = new Uint8Array(blocks.length);  // the block or one below it
  for (let b = blocks.length - 1; b >= 0; b--) {  // children come after their parents
    if (outlier[blocks[b].nodes[0]]) hasOutlier[b] = 1;
    if (hasOutlier[b] && blocks[b].parent >= 0) hasOutlier[blocks[b].parent] = 1;
  }
  const topBlocks = blocks.map((_, b) => b).filter((b) => blocks[b].parent < 0);
  const rootBlock = { kids: topBlocks, kidsDrawn: 0, kidBox: null, moreKids: null };

  function blockRanks(b) { return T.ranks[blocks[b].nodes[0]]; }

  function drawBlock(b) {
    const blk = blocks[b];
    const first = blk.nodes[0];
    const last = blk.nodes[blk.nodes.length - 1];
    const box = el('div', 'blk' + (culprit[first] ? ' culprit' : outlier[first] ? ' outlier' : ''));
    box.dataset.b = b;
    const edge = el('div', 'edge');
    const tog = el('span', 'tog', '▸');
    const rsIdx = blockRanks(b);
    const set = rset(rsIdx);
    const rs = el('span', 'rs', '[' + shortText(D.rsets[rsIdx], 48) + ']');
    rs.title = 'ranks ' + D.rsets[rsIdx] + '\nclick: list them, show the first';
    rs.addEventListener('click', (ev) => { ev.stopPropagation(); showSet(rsIdx); toPanel(); });
    edge.append(tog, rs, el('span', 'cnt', plural(set.count, 'rank')));
    if (culprit[first]) edge.appendChild(el('span', 'tag culprit', 'culprit'));
    else if (outlier[first]) edge.appendChild(el('span', 'tag outlier', 'outlier'));
    const below = blk.kids.length ? ' · ' + blk.kids.length + ' branches' : '';
    edge.appendChild(el('span', 'peek', '… ' + frameText(T.frame[last]) + ' · ' +
      plural(blk.nodes.length, 'frame') + below));
    edge.addEventListener('click', () => toggle(b));
    box.appendChild(edge);
    blk.el = box;
    blk.tog = tog;
    return box;
  }

  function drawBody(b) {
    const blk = blocks[b];
    const body = el('div', 'body');
    const nodes = blk.nodes;
    const fold = nodes.length > FOLD_OVER;
    const line = (n) => {
      const ln = frameLine(T.frame[n], 'ln');
      ln.dataset.n = n;
      if (query && frameHit(T.frame[n])) ln.classList.add('hit');
      return ln;
    };
    const head = fold ? nodes.slice(0, FOLD_HEAD) : nodes;
    for (const n of head) body.appendChild(line(n));
    if (fold) {
      const hidden = nodes.slice(FOLD_HEAD, nodes.length - FOLD_TAIL);
      const more = el('div', 'ln more', '⋯ ' + plural(hidden.length, 'more frame') + ' (click to show)');
      more.addEventListener('click', () => unfold(b));
      body.appendChild(more);
      blk.more = more;
      blk.hidden = hidden;
      for (const n of nodes.slice(nodes.length - FOLD_TAIL)) body.appendChild(line(n));
    }
    blk.lineOf = line;
    const kidBox = el('div', 'kids');
    drawKids(blk, kidBox, 0);
    body.appendChild(kidBox);
    blk.body = body;
    blk.el.appendChild(body);
    blk.drawn = true;
  }

  function drawKids(blk, box, from) {  // KIDS_SHOWN at a time: a node may have 100k branches
    const upto = Math.min(blk.kids.length, from + KIDS_SHOWN);
    for (let i = from; i < upto; i++) box.appendChild(drawBlock(blk.kids[i]));
    blk.kidsDrawn = upto;
    blk.kidBox = box;
    blk.moreKids = null;
    if (upto < blk.kids.length) {
      const more = el('div', 'ln more', '⋯ ' + plural(blk.kids.length - upto, 'more branch') + ' (click to show)');
      more.addEventListener('click', () => drawMoreKids(blk));
      box.appendChild(more);
      blk.moreKids = more;
    }
  }
  function drawMoreKids(blk) {
    if (blk.moreKids) blk.moreKids.remove();
    drawKids(blk, blk.kidBox, blk.kidsDrawn);
  }
  function ensureDrawn(b) {  // a branch beyond those drawn so far below its (open) parent
    const up = blocks[b].parent >= 0 ? blocks[blocks[b].parent] : rootBlock;
    while (!blocks[b].el && up.kidsDrawn < up.kids.length) drawMoreKids(up);
  }

  function unfold(b) {
    const blk = blocks[b];
    if (!blk.more) return;
    const frag = document.createDocumentFragment();
    for (const n of blk.hidden) frag.appendChild(blk.lineOf(n));
    blk.more.replaceWith(frag);
    blk.more = null;
  }

  function setOpen(b, open) {
    const blk = blocks[b];
    if (open && !blk.drawn) drawBody(b);
    blk.open = open;
    blk.el.classList.toggle('open', open);
    if (blk.body) blk.body.hidden = !open;
    blk.tog.textContent = open ? '▾' : '▸';
  }
  function toggle(b) { setOpen(b, !blocks[b].open); }

  function reveal(n) {  // open every branch down to node n, unfold it, scroll to it
    const b = blockOf[n];
    if (b < 0) return null;
    const chain = [];
    for (let c = b; c >= 0; c = blocks[c].parent) chain.push(c);
    for (let i = chain.length - 1; i >= 0; i--) {
      ensureDrawn(chain[i]);
      setOpen(chain[i], true);
    }
    const blk = blocks[b];
    if (blk.more && blk.hidden.indexOf(n) >= 0) unfold(b);
    const line = blk.body.querySelector('.ln[data-n="' + n + '"]');
    if (line) {
      for (const old of document.querySelectorAll('.ln.flash')) old.classList.remove('flash');
      line.classList.add('flash');
      line.scrollIntoView({ block: 'center' });
    }
    return line;
  }

  function drawTree() {
    const box = $('tree');
    box.textContent = '';
    if (!N) {
      box.appendChild(el('p', 'dim', 'no stacks were merged (no rank could be read)'));
      return;
    }
    drawKids(rootBlock, box, 0);
    // open the top, every branch on the way to an outlier, and each open branch's
    // largest child, breadth first, within a budget
    let budget = OPEN_BUDGET;
    const queue = topBlocks.slice();
    while (queue.length && budget > 0) {
      const b = queue.shift();
      if (!blocks[b].el) continue;  // beyond the branches drawn at once
      setOpen(b, true);
      budget--;
      const ks = blocks[b].kids;
      let largest = -1;
      for (const k of ks) if (largest < 0 || rset(blockRanks(k)).count > rset(blockRanks(largest)).count) largest = k;
      for (const k of ks) if (hasOutlier[k] || k === largest) queue.push(k);
    }
    $('tree-stats').textContent = plural(N - 1, 'frame') + ' in ' + plural(blocks.length, 'branch') +
      ' · ' + plural(T.divergence.length, 'divergence point') + ' · ' +
      plural(blocks.filter((bk) => outlier[bk.nodes[0]]).length, 'outlier branch');
  }

  // ------------------------------------------------------------------ search
  let query = '';
  let frameHits = null;
  function frameHit(fi) { return frameHits !== null && frameHits[fi] === 1; }
  function search(text) {
    query = text.trim().toLowerCase();
    for (const old of document.querySelectorAll('.hit')) old.classList.remove('hit');
    const out = $('search-results');
    out.textContent = '';
    if (!query) { frameHits = null; return; }
    frameHits = new Uint8Array(D.frames.length);
    D.frames.forEach((f, i) => {
      if (f[0].toLowerCase().includes(query) || f[2].toLowerCase().includes(query) ||
          f[1].toLowerCase().includes(query)) frameHits[i] = 1;
    });
    const hits = [];
    for (let n = 1; n < N; n++) if (frameHits[T.frame[n]]) hits.push(n);
    for (const line of document.querySelectorAll('[data-f]')) {
      if (frameHits[Number(line.dataset.f)]) line.classList.add('hit');
    }
    out.appendChild(el('div', 'dim', hits.length ? plural(hits.length, 'place') + ' in the tree' +
      (hits.length > RESULTS_MAX ? ', the first ' + RESULTS_MAX + ' listed' : '') :
      'no frame in the tree matches'));
    const where = threadHits();  // every thread of every rank, not only the merged ones
    if (where.count) {
      const line = el('div', 'dim', 'in the threads of ' + plural(where.count, 'rank') + ' ');
      const go = el('button', null, 'show rank ' + rankIds[where.first]);
      go.addEventListener('click', () => showRank(rankIds[where.first]));
      line.appendChild(go);
      out.appendChild(line);
    }
    for (const n of hits.slice(0, RESULTS_MAX)) {
      const go = el('button', 'result', frameText(T.frame[n]) + '  · ' +
        plural(rset(T.ranks[n]).count, 'rank') + ' [' + shortText(D.rsets[T.ranks[n]], 32) + ']');
      go.addEventListener('click', () => reveal(n));
      out.appendChild(go);
    }
    if (shown >= 0) showRank(rankIds[shown]);  // its matching frames marked, their threads open
    if (hits.length) reveal(hits[0]);
  }

  function threadHits() {  // the ranks with a matching frame in any thread of any sample
    const stackHit = D.stacks.map((fs) => fs.some((f) => frameHits[f] === 1));
    const sampleHit = D.samples.map((s) => Array.isArray(s) && s.some((th) => stackHit[th[1]]));
    const viewHit = D.views.map((v) => v.some((s) => sampleHit[s]));
    let count = 0;
    let first = -1;
    for (let i = 0; i < viewCol.length; i++) {
      if (viewCol[i] >= 0 && viewHit[viewCol[i]]) {
        count++;
        if (first < 0) first = i;
      }
    }
    return { count: count, first: first };
  }

  // ------------------------------------------------------------------ ranks
  let shown = -1;
  function showSet(rsIdx) {
    const box = $('rank-set');
    box.textContent = '';
    const set = rset(rsIdx);
    box.appendChild(el('div', 'dim', plural(set.count, 'rank') + ': ' + shortText(D.rsets[rsIdx], 200)));
    const links = el('div', 'rank-links');
    let listed = 0;
    outer: for (const [a, b] of set) {
      for (let r = a; r <= b; r++) {
        if (listed++ >= SET_LINKS_MAX) { links.appendChild(el('span', 'dim', '…')); break outer; }
        const go = el('button', null, r);
        go.addEventListener('click', () => showRank(r));
        links.appendChild(go);
      }
    }
    box.appendChild(links);
    if (set.length) showRank(set[0][0]);
  }

  function toPanel() {  // one column (a narrow window): the panel is below the sections
    if (window.matchMedia('(max-width: 900px)').matches) $('rank-panel').scrollIntoView({ block: 'start' });
  }

  function showRank(rank) {
    const view = $('rank-view');
    view.textContent = '';
    view.className = '';
    $('rank-input').value = String(rank);
    const i = rankIndex(rank);
    if (i < 0) {
      view.appendChild(el('p', 'err', 'rank ' + rank + ' is not in this report'));
      return;
    }
    shown = i;
    const [state, op, thread, detail, working] = D.info[infoCol[i]];
    const head = el('div', 'rank-head');
    head.appendChild(el('b', null, 'rank ' + rank));
    head.appendChild(document.createTextNode(' · ' + state + (working ? ' (working)' : '')));
    if (inRanges(culpritRanges, rank)) head.appendChild(el('span', 'tag culprit', 'culprit'));
    view.appendChild(head);
    const kv = (k, v) => {
      if (v === '' || v === null || v === undefined) return;
      const row = el('div', 'kv');
      row.appendChild(el('b', null, k));
      row.appendChild(document.createTextNode(' ' + v));
      view.appendChild(row);
    };
    kv('host', D.hosts[hostCol[i]]);
    kv('pid', D.ranks.pid[i]);
    kv('op', op);
    kv('thread', thread);
    kv('detail', detail);
    const leaf = leafOf(rank);
    if (leaf > 0) {
      const go = el('button', null, 'show in the tree');
      go.addEventListener('click', () => reveal(leaf));
      view.appendChild(go);
    }
    const v = viewCol[i];
    if (v < 0) {
      view.appendChild(el('p', 'dim', 'no stacks were captured for this rank'));
      return;
    }
    const samples = D.views[v];
    let s = 0;
    while (s < samples.length) {  // identical samples in a row are shown once
      let e = s;
      while (e + 1 < samples.length && samples[e + 1] === samples[s]) e++;
      const label = s === e ? 'sample ' + (s + 1) : 'samples ' + (s + 1) + '–' + (e + 1) + ' (identical)';
      view.appendChild(el('div', 'sample-head', label + ' of ' + samples.length));
      drawSample(view, D.samples[samples[s]], thread);
      s = e + 1;
    }
  }

  function drawSample(box, sample, analysed) {
    if (!Array.isArray(sample)) {
      box.appendChild(el('div', 'err', 'not captured: ' + sample.error));
      return;
    }
    for (const [name, st, flags] of sample) {
      const frames = D.stacks[st];
      const det = el('details', 'th');
      det.open = name === analysed || sample.length === 1 || frames.some((fi) => frameHit(fi));
      const marks = (flags & 1 ? ' · active' : '') + (flags & 2 ? ' · holds the GIL' : '');
      const innermost = frames.length ? frameText(frames[frames.length - 1]) : 'no frames';
      det.appendChild(el('summary', null, (name || 'thread') + marks + ' — ' + innermost +
        ' · ' + plural(frames.length, 'frame')));
      const body = el('div', 'th-frames');
      for (const fi of frames) {
        const line = frameLine(fi, '');
        if (frameHit(fi)) line.classList.add('hit');
        body.appendChild(line);
      }
      det.appendChild(body);
      box.appendChild(det);
    }
  }

  function leafOf(rank) {  // the deepest tree node the rank goes through
    if (!N) return -1;
    let n = 0;
    for (;;) {
      const next = kids[n].find((k) => inRanges(rset(T.ranks[k]), rank));
      if (next === undefined) return n;
      n = next;
    }
  }

  // ------------------------------------------------------------------ classes
  function drawClasses() {
    const box = $('classes');
    if (!D.classes.length) { box.appendChild(el('p', 'dim', 'no classes')); return; }
    const table = el('table', 'classes');
    const head = el('tr');
    for (const h of ['ranks', '', 'operation', '']) head.appendChild(el('th', null, h));
    table.appendChild(head);
    D.classes.forEach(([rsIdx, op, leaf], i) => {
      if (i >= 200) return;
      const row = el('tr');
      const ranks = el('td', 'mono');
      const link = el('span', 'rs', '[' + shortText(D.rsets[rsIdx], 40) + ']');
      link.addEventListener('click', () => showSet(rsIdx));
      ranks.appendChild(link);
      row.appendChild(ranks);
      row.appendChild(el('td', 'dim', plural(rset(rsIdx).count, 'rank')));
      row.appendChild(el('td', 'mono', op || 'no distributed op'));
      const cell = el('td');
      if (leaf > 0) {
        const go = el('button', null, 'show');
        go.addEventListener('click', () => reveal(leaf));
        cell.appendChild(go);
      }
      row.appendChild(cell);
      table.appendChild(row);
    });
    box.appendChild(table);
    if (D.classes.length > 200) box.appendChild(el('p', 'dim', '… ' + (D.classes.length - 200) + ' more classes'));
  }

  // ------------------------------------------------------------------ wiring
  function wire() {
    let timer = 0;
    $('search').addEventListener('input', (ev) => {
      clearTimeout(timer);
      timer = setTimeout(() => search(ev.target.value), 150);
    });
    $('search').addEventListener('keydown', (ev) => {
      if (ev.key === 'Enter') { clearTimeout(timer); search(ev.target.value); }
    });
    document.addEventListener('keydown', (ev) => {
      if (ev.key === '/' && document.activeElement.tagName !== 'INPUT') { ev.preventDefault(); $('search').focus(); }
    });
    const go = () => {
      const text = $('rank-input').value.trim();
      if (/^[0-9]+$/.test(text)) showRank(Number(text));
    };
    $('rank-go').addEventListener('click', go);
    $('rank-input').addEventListener('keydown', (ev) => { if (ev.key === 'Enter') go(); });
    $('rank-prev').addEventListener('click', () => { if (shown > 0) showRank(rankIds[shown - 1]); });
    $('rank-next').addEventListener('click', () => {
      if (shown + 1 < rankIds.length) showRank(rankIds[shown + 1]);
    });
    $('expand-outliers').addEventListener('click', () => {
      const tops = (T ? T.outliers : []).filter((n) => !outlier[T.parent[n]]);
      for (let i = tops.length - 1; i >= 0; i--) reveal(tops[i]);  // ends on the first
    });
    $('collapse-all').addEventListener('click', () => {
      for (let b = 0; b < blocks.length; b++) if (blocks[b].drawn) setOpen(b, false);
    });
    for (const row of document.querySelectorAll('#ranks tr[data-rank]')) {
      row.addEventListener('click', () => { showRank(Number(row.dataset.rank)); toPanel(); });
    }
    const culprits = $('culprits');
    if (culprits) {
      culprits.title = 'click: list the culprit ranks, show the first';
      culprits.addEventListener('click', () => { if (D.culprits >= 0) { showSet(D.culprits); toPanel(); } });
    }
  }

  drawTree();
  drawClasses();
  wire();
  if (culpritRanges.length) showRank(culpritRanges[0][0]);
  document.body.dataset.ready = String(performance.now());
})();
