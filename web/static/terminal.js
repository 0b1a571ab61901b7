// The browser terminal: xterm.js over a WebSocket to the console, which
// bridges it to the audited terminal gateway. After a dropped connection it
// reconnects to the same command and continues from the last chunk it
// showed, so nothing is lost or shown twice.
(function () {
  "use strict";
  const el = document.getElementById("terminal");
  if (!el || !window.Terminal) {
    return;
  }
  const status = document.getElementById("terminal-status");
  const readOnly = el.dataset.watch === "1";
  const term = new window.Terminal({
    convertEol: false,
    cursorBlink: !readOnly,
    disableStdin: readOnly,
    fontSize: 14,
    scrollback: 10000,
  });
  const fit = new window.FitAddon.FitAddon();
  term.loadAddon(fit);
  term.open(el);
  fit.fit();

  const state = {
    commandId: Number(el.dataset.command || 0),
    cursor: 0,
    connects: 0,
    ended: false,
    ws: null,
  };
  // For people debugging, and for the browser tests.
  state.term = term;
  window.gatehouseTerminal = state;

  function say(text, kind) {
    if (status) {
      status.textContent = text;
      status.dataset.state = kind;
    }
  }

  // The session page's other parts (state, last used, the command list)
  // follow what the terminal does: session-live.js listens.
  function tell(what) {
    document.dispatchEvent(new CustomEvent("gatehouse:terminal", { detail: what }));
  }

  function decode(b64) {
    const bin = atob(b64 || "");
    const out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) {
      out[i] = bin.charCodeAt(i);
    }
    return out;
  }

  function url() {
    const proto = location.protocol === "https:" ? "wss:" : "ws:";
    const q = new URLSearchParams();
    if (state.commandId) {
      q.set("command", String(state.commandId));
      q.set("cursor", String(state.cursor));
    }
    if (readOnly) {
      q.set("watch", "1");
    }
    q.set("rows", String(term.rows));
    q.set("cols", String(term.cols));
    return proto + "//" + location.host + el.dataset.ws + "?" + q.toString();
  }

  function send(msg) {
    if (state.ws && state.ws.readyState === WebSocket.OPEN) {
      state.ws.send(JSON.stringify(msg));
    }
  }

  function connect() {
    state.connects++;
    say(state.connects === 1 ? "Connecting…" : "Reconnecting…", "connecting");
    // The CSRF token travels as a subprotocol: a browser cannot set
    // headers on a WebSocket, and a query string would end up in logs.
    const ws = new WebSocket(url(), ["gatehouse.v1", "csrf." + el.dataset.csrf]);
    state.ws = ws;
    ws.onmessage = function (ev) {
      let msg;
      try {
        msg = JSON.parse(ev.data);
      } catch (e) {
        return;
      }
      switch (msg.type) {
        case "attached":
          state.commandId = msg.command_id;
          el.dataset.command = String(msg.command_id);
          say(readOnly ? "Watching (read-only)" : "Connected to shell #" + msg.command_id, "connected");
          // ?terminal=new opened this shell; a reload must come back to
          // it (the page finds the viewer's running shell), not open
          // another.
          if (!readOnly && new URLSearchParams(location.search).get("terminal") === "new") {
            history.replaceState(null, "", location.pathname);
          }
          tell("attached");
          if (!readOnly) {
            send({ type: "resize", rows: term.rows, cols: term.cols });
          }
          break;
        case "output":
          if (msg.id > state.cursor) {
            term.write(decode(msg.data));
            state.cursor = msg.id;
          }
          break;
        case "exit":
          state.ended = true;
          if (msg.ended_by === "session_close") {
            term.write("\r\n[the session was closed: closing it ended this shell and everything it ran]\r\n");
            say("Ended: the session was closed, which ended this shell and everything it ran.", "ended");
          } else {
            term.write("\r\n[command " + msg.state + (msg.exit_code !== undefined && msg.exit_code !== null ? ", exit code " + msg.exit_code : "") + "]\r\n");
            say("Ended (" + msg.state + ")", "ended");
          }
          tell("exit");
          break;
        case "error":
          state.ended = true;
          say(msg.message || "The terminal stopped.", "error");
          break;
      }
    };
    ws.onclose = function () {
      if (state.ended) {
        return;
      }
      say("Connection lost; reconnecting…", "connecting");
      setTimeout(connect, Math.min(500 * state.connects, 5000));
    };
  }

  if (!readOnly) {
    term.onData(function (data) {
      send({ type: "input", data: data });
      if (data.indexOf("\r") >= 0) {
        tell("enter"); // a command line was run
      }
    });
  }
  window.addEventListener("resize", function () {
    fit.fit();
    if (!readOnly) {
      send({ type: "resize", rows: term.rows, cols: term.cols });
    }
  });
  // The page offers an open button unless the terminal starts at once
  // (autostart, or watching).
  const open = document.getElementById("terminal-open");
  if (!open) {
    connect();
  } else {
    open.addEventListener("click", function () {
      open.disabled = true;
      connect();
      term.focus();
    });
  }
})();
