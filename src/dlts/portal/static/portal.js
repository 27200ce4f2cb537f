/* DLTS portal: the only script. Progressive enhancement: every page works without it.
   - forms with data-confirm ask before sending
   - the jobs list refreshes its rows while a job on it has not ended
   - the job page follows the log
   - the submit page shows the free-GPU histogram of the chosen SKU */
(function () {
  'use strict';

  document.querySelectorAll('form[data-confirm]').forEach(function (form) {
    form.addEventListener('submit', function (e) {
      if (!window.confirm(form.dataset.confirm)) e.preventDefault();
    });
  });

  var tickAll = document.getElementById('tick-all');
  if (tickAll) {
    tickAll.addEventListener('change', function () {
      document.querySelectorAll('#jobs-table input[name=ids]').forEach(function (box) { box.checked = tickAll.checked; });
    });
  }

  var table = document.getElementById('jobs-table');
  if (table) {
    var ENDED = ['finished', 'failed', 'killed', 'error'];
    var live = function () {
      return Array.from(table.querySelectorAll('tr[data-status]')).some(function (r) { return ENDED.indexOf(r.dataset.status) < 0; });
    };
    var ticked = function () { return table.querySelector('input[type=checkbox]:checked'); };
    var refresh = function () {
      if (!live()) return;
      if (ticked()) { setTimeout(refresh, 3000); return; }  // never pull rows from under the user's ticks
      fetch(location.href, {credentials: 'same-origin'}).then(function (r) { return r.text(); }).then(function (html) {
        var fresh = new DOMParser().parseFromString(html, 'text/html').querySelector('#jobs-table tbody');
        var body = table.querySelector('tbody');
        if (fresh && body && !ticked()) body.replaceWith(fresh);
        setTimeout(refresh, 3000);
      }).catch(function () { setTimeout(refresh, 10000); });
    };
    setTimeout(refresh, 3000);
  }

  var log = document.getElementById('log');
  if (log && log.dataset.url) {
    var state = document.getElementById('log-state');
    var attempt = null, offset = null;
    var poll = function () {
      var query = offset === null ? '?tail=262144' : '?offset=' + offset;
      if (attempt !== null) query += '&attempt=' + attempt;
      fetch(log.dataset.url + query, {credentials: 'same-origin'}).then(function (r) { return r.json(); }).then(function (d) {
        if (d.error) { state.textContent = d.error; return; }
        if (offset === null && d.offset > 0) log.textContent += '[' + d.offset + ' earlier bytes: download the full log]\n';
        attempt = d.attempt;
        if (d.data) {
          var atEnd = log.scrollTop + log.clientHeight >= log.scrollHeight - 20;
          log.textContent += d.data;
          if (atEnd) log.scrollTop = log.scrollHeight;
        }
        offset = d.next_offset;
        var badge = document.querySelector('#job-status .badge');
        if (badge && badge.textContent !== d.status) badge.textContent = d.status;
        if (d.complete) { state.textContent = 'Job ' + d.status + '; log complete (' + d.size + ' bytes).'; return; }
        if (d.next_offset < d.size) { setTimeout(poll, 50); return; }  // more is already there
        if (d.latest_attempt > attempt) {  // retried: follow the new attempt from its start
          attempt = d.latest_attempt; offset = 0;
          log.textContent += '\n--- attempt ' + attempt + ' ---\n';
          setTimeout(poll, 50); return;
        }
        state.textContent = 'Following the log (' + d.status + ')…';
        setTimeout(poll, 2000);
      }).catch(function () { state.textContent = 'Could not read the log; retrying.'; setTimeout(poll, 5000); });
    };
    poll();
  }

  var sku = document.getElementById('sku');
  if (sku) {
    var show = function () {
      document.querySelectorAll('.hist-block').forEach(function (block) {
        block.hidden = Boolean(sku.value) && block.dataset.sku !== sku.value;
      });
    };
    sku.addEventListener('change', show);
    show();
  }
})();
