package agentd

// ring is a session's bounded output buffer: a deque of chunks whose data
// together stays within max bytes. Chunk data is allocated per chunk as
// output arrives, so an idle session holds no buffer at all. Chunk data is
// never mutated once appended, so readers may keep slices of it after the
// session lock is released. ring is not safe for concurrent use.
type ring struct {
	max    int
	chunks []chunk // live chunks are chunks[head:]
	head   int
	bytes  int    // bytes held by live chunks
	lastID uint64 // id of the newest chunk ever appended (0: none)
	total  uint64 // bytes ever appended, including dropped ones

	// blocking rings never evict a chunk above acked, the highest cursor a
	// poller has asked for; the producer waits for room instead.
	blocking bool
	acked    uint64

	// evictedEnds remembers the end offsets of the most recently evicted
	// chunks, indexed by id modulo evictedWindow, so a cursor that fell
	// behind learns exactly how many bytes it lost. Allocated on first
	// eviction.
	evictedEnds []uint64
	lastEvicted uint64
}

type chunk struct {
	id     uint64
	stream uint8
	end    uint64 // offset just past the chunk in the whole output
	data   []byte // may have lost its head if it alone exceeded max
}

// evictedWindow is how many evicted chunks keep their end offsets.
const evictedWindow = 4096

// Stream numbers stored in chunks.
const (
	streamStdout uint8 = iota
	streamStderr
	streamPTY
)

func streamName(s uint8) string {
	switch s {
	case streamStderr:
		return StreamStderr
	case streamPTY:
		return StreamPTY
	default:
		return StreamStdout
	}
}

func (r *ring) live() []chunk { return r.chunks[r.head:] }

// fits reports whether n more bytes can be appended in blocking mode without
// evicting output no poller has asked past. Non-blocking rings always fit.
func (r *ring) fits(n int) bool {
	if !r.blocking {
		return true
	}
	r.evict(r.bytes+n-r.max, true)
	return r.bytes == 0 || r.bytes+n <= r.max
}

// ack records that a poller asked for chunks after cursor, which makes older
// chunks evictable in blocking mode.
func (r *ring) ack(cursor uint64) bool {
	if cursor <= r.acked {
		return false
	}
	r.acked = min(cursor, r.lastID)
	return true
}

// add appends a chunk whose data the ring now owns, evicting (or trimming)
// the oldest output so the ring stays within max bytes.
func (r *ring) add(stream uint8, data []byte) {
	r.total += uint64(len(data))
	if len(data) > r.max {
		data = data[len(data)-r.max:]
	}
	r.evict(r.bytes+len(data)-r.max, false)
	r.lastID++
	r.chunks = append(r.chunks, chunk{id: r.lastID, stream: stream, end: r.total, data: data})
	r.bytes += len(data)
}

// evict drops the oldest chunks until need bytes are freed (or, with
// ackedOnly, until the next chunk is one no poller has asked past).
func (r *ring) evict(need int, ackedOnly bool) {
	for need > 0 && r.head < len(r.chunks) {
		c := &r.chunks[r.head]
		if ackedOnly && c.id > r.acked {
			return
		}
		if r.evictedEnds == nil {
			r.evictedEnds = make([]uint64, evictedWindow)
		}
		r.evictedEnds[c.id%evictedWindow] = c.end
		r.lastEvicted = c.id
		need -= len(c.data)
		r.bytes -= len(c.data)
		*c = chunk{}
		r.head++
	}
	if r.head == len(r.chunks) {
		r.chunks, r.head = r.chunks[:0], 0
	} else if r.head >= 256 && r.head*2 >= len(r.chunks) {
		n := copy(r.chunks, r.chunks[r.head:])
		clear(r.chunks[n:])
		r.chunks, r.head = r.chunks[:n], 0
	}
}

// endOffset is the output offset just past chunk id, or the best lower bound
// when the chunk was evicted too long ago to remember.
func (r *ring) endOffset(id uint64) uint64 {
	if id == 0 {
		return 0
	}
	live := r.live()
	if len(live) > 0 && id >= live[0].id {
		return live[id-live[0].id].end
	}
	if r.lastEvicted == 0 {
		return 0
	}
	oldest := uint64(1)
	if r.lastEvicted > evictedWindow {
		oldest = r.lastEvicted - evictedWindow + 1
	}
	if id < oldest {
		// Forgotten: the oldest remembered end bounds what the cursor saw,
		// so the drop count is a lower bound.
		return r.evictedEnds[oldest%evictedWindow]
	}
	return r.evictedEnds[id%evictedWindow]
}

// read returns the chunks after cursor (sharing their data), the cursor to
// use next, and how many bytes between cursor and the first returned chunk
// were dropped. cursor must not exceed lastID.
func (r *ring) read(cursor uint64, out []Chunk) ([]Chunk, uint64, uint64) {
	live := r.live()
	retainedStart := r.total
	if len(live) > 0 {
		retainedStart = live[0].end - uint64(len(live[0].data))
	}
	var dropped uint64
	if seen := r.endOffset(cursor); seen < retainedStart {
		dropped = retainedStart - seen
	}
	first := 0
	if len(live) > 0 && cursor >= live[0].id {
		first = int(cursor - live[0].id + 1)
	}
	for _, c := range live[first:] {
		out = append(out, Chunk{ID: c.id, Stream: streamName(c.stream), Data: c.data})
	}
	return out, r.lastID, dropped
}
