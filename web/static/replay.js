// Replay of a recorded command with asciinema-player: the player fetches
// the recording as asciicast v2 (that read is audited) and plays it at its
// original timing; play, pause and seek are the player's own controls, the
// speed buttons re-open it at the same moment with another pace.
(function () {
  "use strict";
  const el = document.getElementById("replay");
  if (!el || !window.AsciinemaPlayer) {
    return;
  }
  const state = { player: null, speed: 1 };
  // For people debugging, and for the browser tests.
  window.gatehouseReplay = state;

  function open(startAt, autoPlay) {
    if (state.player) {
      state.player.dispose();
    }
    const opts = { controls: true, fit: "width", speed: state.speed, autoPlay: autoPlay, preload: true };
    if (startAt > 0) {
      opts.startAt = startAt;
    }
    state.player = window.AsciinemaPlayer.create(el.dataset.src, el, opts);
  }

  // seekEnd shows the recording's last screen, paused.
  state.seekEnd = function () {
    const p = state.player;
    return Promise.resolve(p.getDuration()).then(function (d) {
      return p.seek(d);
    });
  };

  document.querySelectorAll(".replay-speed").forEach(function (b) {
    b.addEventListener("click", function () {
      const at = state.player ? state.player.getCurrentTime() : 0;
      Promise.resolve(at).then(function (t) {
        state.speed = Number(b.dataset.speed) || 1;
        open(t || 0, true);
        document.querySelectorAll(".replay-speed").forEach(function (o) {
          o.setAttribute("aria-pressed", o === b ? "true" : "false");
        });
      });
    });
  });

  // The jump lists: a typed line or a program seeks the player to its
  // moment and plays from there.
  document.querySelectorAll(".replay-jump").forEach(function (b) {
    b.addEventListener("click", function () {
      const p = state.player;
      const t = Number(b.dataset.t) || 0;
      Promise.resolve(p.seek(t))
        .then(function () {
          return p.getCurrentTime();
        })
        .then(function (at) {
          // For the browser tests: where the jump went.
          state.jumpedTo = t;
          state.positionAfterJump = at;
          return p.play();
        });
    });
  });

  const start = Number(el.dataset.start || 0);
  open(start, start > 0);
})();
