package gateway

import (
	"testing"
	"time"
)

// TestResizeWindows: the first change of a command passes and opens a
// window; changes within it are held, the last one winning and counted;
// the window's close hands over only that last one, and a window that
// closes with nothing held ends, leaving no state and no timer behind.
// Windows of different commands are independent.
func TestResizeWindows(t *testing.T) {
	t.Parallel()
	w := &resizeWindows{every: 20 * time.Millisecond}
	a, b := knownKey{id: 1}, knownKey{id: 2}
	type flushed struct {
		key        knownKey
		rows, cols uint16
		n          int
		ok         bool
	}
	got := make(chan flushed, 10)
	var flush func(knownKey)
	flush = func(k knownKey) {
		r, n, ok := w.take(k)
		got <- flushed{k, r.rows, r.cols, n, ok}
		if ok {
			w.reopen(k, flush)
		}
	}

	if w.hold(a, heldResize{rows: 10, cols: 10}) {
		t.Fatal("the first change of a command was held")
	}
	if w.hold(b, heldResize{rows: 5, cols: 5}) {
		t.Fatal("another command's first change was held")
	}
	for i := range 100 {
		if !w.hold(a, heldResize{rows: uint16(11 + i), cols: 20}) {
			t.Fatalf("change %d within the window passed", i)
		}
	}
	w.reopen(a, flush)
	w.reopen(b, flush)

	want := map[knownKey][]flushed{
		a: {{a, 110, 20, 100, true}, {key: a}},
		b: {{key: b}},
	}
	for range 3 {
		select {
		case f := <-got:
			if len(want[f.key]) == 0 || f != want[f.key][0] {
				t.Fatalf("flushed %+v, want %+v", f, want[f.key])
			}
			want[f.key] = want[f.key][1:]
		case <-time.After(5 * time.Second):
			t.Fatalf("windows did not close; still expecting %+v", want)
		}
	}
	if n := w.pending(); n != 0 {
		t.Fatalf("%d windows still open after every one closed empty", n)
	}
	select {
	case f := <-got:
		t.Fatalf("a window closed again after it ended: %+v", f)
	case <-time.After(100 * time.Millisecond):
	}
	if w.hold(a, heldResize{rows: 1, cols: 1}) {
		t.Fatal("a change after the window ended was held")
	}
}
