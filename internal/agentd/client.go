package agentd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// Client is a typed client of one agentd. It is safe for concurrent use and
// reuses connections through its http.Client.
type Client struct {
	base    string
	token   string
	http    *http.Client
	headers http.Header
}

// ClientOption configures a Client.
type ClientOption func(*Client)

// WithHeader adds a header to every request, e.g. a sandbox proxy's access
// token.
func WithHeader(key, value string) ClientOption {
	return func(c *Client) { c.headers.Add(key, value) }
}

// NewClient returns a client of the agentd at baseURL (e.g.
// "http://10.0.0.5:49984"). httpClient may carry a custom transport, such as
// one routing through a sandbox proxy; nil uses a client with a pooled
// transport. The http.Client should have no Timeout: long-polls and
// downloads are bounded by contexts instead.
func NewClient(baseURL, token string, httpClient *http.Client, opts ...ClientOption) *Client {
	if httpClient == nil {
		httpClient = &http.Client{}
		if t, ok := http.DefaultTransport.(*http.Transport); ok {
			t = t.Clone()
			t.MaxIdleConnsPerHost = 32 // concurrent long-polls to one agentd
			httpClient.Transport = t
		}
	}
	c := &Client{
		base:    strings.TrimRight(baseURL, "/"),
		token:   token,
		http:    httpClient,
		headers: make(http.Header),
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Health calls GET /healthz.
func (c *Client) Health(ctx context.Context) (*Health, error) {
	var h Health
	if err := c.do(ctx, http.MethodGet, "/healthz", nil, &h, MaxControlAnswer); err != nil {
		return nil, err
	}
	return &h, nil
}

// CreateSession starts a command. With WaitMS set, a short command's final
// state and output arrive in the response.
func (c *Client) CreateSession(ctx context.Context, req CreateSessionRequest) (*SessionResponse, error) {
	var resp SessionResponse
	var hdr http.Header
	if req.ExecRecords {
		hdr = http.Header{HeaderExecRecords: []string{"1"}}
	}
	httpResp, err := c.sendWith(ctx, http.MethodPost, "/v1/sessions", req, "", hdr)
	if err != nil {
		return nil, err
	}
	defer httpResp.Body.Close()
	if err := decodeAnswer(httpResp, &resp, MaxOutputAnswer, "POST /v1/sessions"); err != nil {
		return nil, err
	}
	resp.ExecRecords = httpResp.Header.Get(HeaderExecRecords)
	return &resp, nil
}

// Poll returns the output after cursor, waiting up to wait for some.
func (c *Client) Poll(ctx context.Context, id string, cursor uint64, wait time.Duration) (*SessionResponse, error) {
	return c.poll(ctx, id, cursor, wait, acking(cursor))
}

// Peek is Poll for a reader that must not release output a blocking
// session holds back (overflow "block"): only acknowledging polls, such as
// a recorder's, let agentd drop what they have read.
func (c *Client) Peek(ctx context.Context, id string, cursor uint64, wait time.Duration) (*SessionResponse, error) {
	return c.poll(ctx, id, cursor, wait, release{})
}

// ReadAhead is Poll for a recorder that reads the next output while it is
// still storing what it read before: it releases only the chunks up to
// ackTo (at most cursor), what it has stored. Use it only with an agentd
// whose earlier answers had AckTo set: an older agentd ignores ackTo and
// releases everything up to cursor.
func (c *Client) ReadAhead(ctx context.Context, id string, cursor, ackTo uint64, wait time.Duration) (*SessionResponse, error) {
	return c.poll(ctx, id, cursor, wait, release{ack: true, to: ackTo})
}

func (c *Client) poll(ctx context.Context, id string, cursor uint64, wait time.Duration, rel release) (*SessionResponse, error) {
	q := url.Values{}
	q.Set("cursor", strconv.FormatUint(cursor, 10))
	q.Set("wait_ms", strconv.FormatInt(wait.Milliseconds(), 10))
	switch {
	case !rel.ack:
		q.Set("ack", "false")
	case rel.to != cursor:
		q.Set("ack_to", strconv.FormatUint(rel.to, 10))
	}
	// The binary form saves base64 and JSON scanning on bulk output.
	httpResp, err := c.send(ctx, http.MethodGet, "/v1/sessions/"+url.PathEscape(id)+"?"+q.Encode(), nil, ChunksMediaType)
	if err != nil {
		return nil, err
	}
	defer httpResp.Body.Close()
	resp := &SessionResponse{}
	if ct := httpResp.Header.Get("Content-Type"); ct != ChunksMediaType {
		if err := decodeAnswer(httpResp, resp, MaxOutputAnswer, "poll"); err != nil {
			return nil, err
		}
	} else if resp, err = readBinary(httpResp.Body, httpResp.ContentLength); err != nil {
		return nil, err
	}
	resp.AckTo = httpResp.Header.Get(HeaderAckTo) == "1"
	return resp, nil
}

// followWait is the long-poll duration Follow asks for.
const followWait = 30 * time.Second

// Follow polls session id from cursor until it ends and all its output has
// been read (responses are capped in size, so this may take several polls
// after the end), calling fn with every poll response that carries output
// or truncation (in order), and returns the final response (whose chunks
// were already passed to fn). It returns fn's error if fn fails, or ctx's
// error.
func (c *Client) Follow(ctx context.Context, id string, cursor uint64, fn func(*SessionResponse) error) (*SessionResponse, error) {
	for {
		resp, err := c.Poll(ctx, id, cursor, followWait)
		if err != nil {
			return nil, err
		}
		if fn != nil && (len(resp.Chunks) > 0 || resp.Truncated) {
			if err := fn(resp); err != nil {
				return nil, err
			}
		}
		cursor = resp.NextCursor
		if resp.State != StateRunning && !resp.More {
			return resp, nil
		}
	}
}

// Result is the collected outcome of Run.
type Result struct {
	SessionID    string
	State        string
	ExitCode     int
	Stdout       []byte // with a TTY: the terminal output
	Stderr       []byte
	DroppedBytes uint64 // output lost to buffer overflow
}

// Run starts a command, follows it to its end and collects its output.
func (c *Client) Run(ctx context.Context, req CreateSessionRequest) (*Result, error) {
	resp, err := c.CreateSession(ctx, req)
	if err != nil {
		return nil, err
	}
	var res Result
	res.SessionID = resp.SessionID
	collect := func(r *SessionResponse) error {
		res.DroppedBytes += r.DroppedBytes
		for _, ch := range r.Chunks {
			if ch.Stream == StreamStderr {
				res.Stderr = append(res.Stderr, ch.Data...)
			} else {
				res.Stdout = append(res.Stdout, ch.Data...)
			}
		}
		return nil
	}
	collect(resp)
	final := resp
	if resp.State == StateRunning || resp.More {
		if final, err = c.Follow(ctx, resp.SessionID, resp.NextCursor, collect); err != nil {
			return nil, err
		}
	}
	res.State = final.State
	if final.ExitCode != nil {
		res.ExitCode = *final.ExitCode
	}
	return &res, nil
}

// WriteStdin sends data (and, with eof, closes stdin).
func (c *Client) WriteStdin(ctx context.Context, id string, data []byte, eof bool) error {
	return c.do(ctx, http.MethodPost, "/v1/sessions/"+url.PathEscape(id)+"/stdin", StdinRequest{Data: data, EOF: eof}, nil, 0)
}

// Resize changes a TTY session's window size.
func (c *Client) Resize(ctx context.Context, id string, rows, cols uint16) error {
	return c.do(ctx, http.MethodPost, "/v1/sessions/"+url.PathEscape(id)+"/resize", ResizeRequest{Rows: rows, Cols: cols}, nil, 0)
}

// Kill kills the session's process group and returns its final state.
func (c *Client) Kill(ctx context.Context, id string) (*SessionResponse, error) {
	return c.kill(ctx, "/v1/sessions/"+url.PathEscape(id))
}

// KillNow is Kill without the kill grace: every process of the session
// gets SIGKILL at once. An agentd that does not know grace=0 kills with
// its grace.
func (c *Client) KillNow(ctx context.Context, id string) (*SessionResponse, error) {
	return c.kill(ctx, "/v1/sessions/"+url.PathEscape(id)+"?grace=0")
}

func (c *Client) kill(ctx context.Context, path string) (*SessionResponse, error) {
	var resp SessionResponse
	if err := c.do(ctx, http.MethodDelete, path, nil, &resp, MaxOutputAnswer); err != nil {
		return nil, err
	}
	return &resp, nil
}

// Stat examines a batch of paths.
func (c *Client) Stat(ctx context.Context, paths ...string) ([]FileStat, error) {
	var resp StatResponse
	if err := c.do(ctx, http.MethodPost, "/v1/files/stat", StatRequest{Paths: paths}, &resp, MaxControlAnswer); err != nil {
		return nil, err
	}
	return resp.Results, nil
}

// Fetch makes agentd download a URL into path.
func (c *Client) Fetch(ctx context.Context, req FetchRequest) (*FetchResponse, error) {
	var resp FetchResponse
	if err := c.do(ctx, http.MethodPost, "/v1/files/fetch", req, &resp, MaxControlAnswer); err != nil {
		return nil, err
	}
	return &resp, nil
}

// WriteFile stores size bytes of body at path with mode (0: 0644),
// replacing a file there once all of it arrived: agentd writes to a
// temporary name and renames. size is the body's length (-1: unknown,
// sent chunked).
func (c *Client) WriteFile(ctx context.Context, path string, mode os.FileMode, body io.Reader, size int64) (*WriteResponse, error) {
	q := url.Values{}
	q.Set("path", path)
	if mode != 0 {
		q.Set("mode", fmt.Sprintf("%04o", mode.Perm()))
	}
	var resp WriteResponse
	if err := c.doRaw(ctx, http.MethodPut, "/v1/files?"+q.Encode(), body, size, &resp); err != nil {
		return nil, err
	}
	return &resp, nil
}

// WriteArchive unpacks the archive in body (format ArchiveTarGz or
// ArchiveZip, size bytes; -1: unknown) into the directory dir, replacing a
// directory there.
func (c *Client) WriteArchive(ctx context.Context, dir, format string, body io.Reader, size int64) (*WriteResponse, error) {
	q := url.Values{}
	q.Set("path", dir)
	q.Set("format", format)
	var resp WriteResponse
	if err := c.doRaw(ctx, http.MethodPut, "/v1/files/archive?"+q.Encode(), body, size, &resp); err != nil {
		return nil, err
	}
	return &resp, nil
}

// Copy makes agentd copy the file or tree at from (an absolute path in the
// environment) to to.
func (c *Client) Copy(ctx context.Context, from, to string) (*CopyResponse, error) {
	var resp CopyResponse
	if err := c.do(ctx, http.MethodPost, "/v1/files/copy", CopyRequest{From: from, To: to}, &resp, MaxControlAnswer); err != nil {
		return nil, err
	}
	return &resp, nil
}

// Rekey replaces agentd's token with newToken (at least
// MinRekeyTokenLength characters). It succeeds once per agentd process;
// afterwards this Client's token is refused and a Client made with
// newToken is needed. An agentd too old to know rekeys answers
// ErrNotFound (Unknown); one already rekeyed ErrAlreadyRekeyed.
func (c *Client) Rekey(ctx context.Context, newToken string) error {
	return c.do(ctx, http.MethodPost, "/v1/token", RekeyRequest{Token: newToken}, nil, 0)
}

// doRaw sends body as raw bytes and decodes a JSON answer into out.
func (c *Client) doRaw(ctx context.Context, method, path string, body io.Reader, size int64, out any) error {
	if body == nil {
		body, size = http.NoBody, 0
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return err
	}
	req.ContentLength = size
	if size == 0 {
		req.Body = http.NoBody
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.doRequest(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return decodeAnswer(resp, out, MaxControlAnswer, method+" "+path)
}

// FileRange is a part of a file being read from agentd. The caller reads
// Body and must close it.
type FileRange struct {
	// Body yields the bytes. It fails with CodeAnswerTooLarge (*Error)
	// rather than yield more than the read's limit.
	Body io.ReadCloser
	// Size is the file's full size (FileHeaderSize).
	Size int64
	// Length is how many bytes Body holds: agentd's Content-Length, or -1
	// when it gave none (a proxy in front of it may re-encode the body).
	Length int64
}

// OpenFile starts reading up to limit bytes of path from offset (limit 0:
// MaxFileRead) and returns once agentd's answer began, so the bytes can be
// passed on as they arrive instead of held. An answer announcing more
// than the limit fails before any of it is read.
func (c *Client) OpenFile(ctx context.Context, path string, offset, limit int64) (*FileRange, error) {
	q := url.Values{}
	q.Set("path", path)
	if offset > 0 {
		q.Set("offset", strconv.FormatInt(offset, 10))
	}
	if limit > 0 {
		q.Set("limit", strconv.FormatInt(limit, 10))
	}
	most := limit
	if most <= 0 || most > MaxFileRead {
		most = MaxFileRead
	}
	resp, err := c.send(ctx, http.MethodGet, "/v1/files?"+q.Encode(), nil, "")
	if err != nil {
		return nil, err
	}
	if resp.ContentLength > most {
		resp.Body.Close()
		return nil, answerTooLarge("file", most)
	}
	size, err := strconv.ParseInt(resp.Header.Get(FileHeaderSize), 10, 64)
	if err != nil || size < 0 {
		size = 0
	}
	body := struct {
		io.Reader
		io.Closer
	}{capReader(resp.Body, most, "file"), resp.Body}
	return &FileRange{Body: body, Size: size, Length: resp.ContentLength}, nil
}

// ReadFile reads up to limit bytes of path from offset (limit 0:
// MaxFileRead) and returns them with the file's full size. It holds the
// whole range in memory: OpenFile passes it on instead.
func (c *Client) ReadFile(ctx context.Context, path string, offset, limit int64) ([]byte, int64, error) {
	f, err := c.OpenFile(ctx, path, offset, limit)
	if err != nil {
		return nil, 0, err
	}
	defer f.Body.Close()
	data, err := readCapped(f.Body, f.Length, MaxFileRead, "file")
	if err != nil {
		return nil, 0, err
	}
	return data, f.Size, nil
}

// do sends a JSON request and decodes a JSON response of at most limit
// bytes into out (if not nil).
func (c *Client) do(ctx context.Context, method, path string, in, out any, limit int64) error {
	resp, err := c.send(ctx, method, path, in, "")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		// Read a little so the connection can be reused; a longer body
		// (no agentd sends one here) closes it instead.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxDrain))
		return nil
	}
	return decodeAnswer(resp, out, limit, method+" "+path)
}

// decodeAnswer decodes resp's JSON body into out, reading at most limit
// bytes of it: a larger answer fails with CodeAnswerTooLarge.
func decodeAnswer(resp *http.Response, out any, limit int64, what string) error {
	if resp.ContentLength > limit {
		return answerTooLarge("body", limit)
	}
	if err := json.NewDecoder(capReader(resp.Body, limit, "body")).Decode(out); err != nil {
		var ae *Error
		if errors.As(err, &ae) {
			return ae
		}
		return fmt.Errorf("agentd: decode %s response: %w", what, err)
	}
	return nil
}

// send performs a request and turns error statuses into *Error.
func (c *Client) send(ctx context.Context, method, path string, in any, accept string) (*http.Response, error) {
	return c.sendWith(ctx, method, path, in, accept, nil)
}

// sendWith is send with extra request headers.
func (c *Client) sendWith(ctx context.Context, method, path string, in any, accept string, extra http.Header) (*http.Response, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return nil, err
	}
	for k, v := range c.headers {
		req.Header[k] = v
	}
	for k, v := range extra {
		req.Header[k] = v
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	return c.doRequest(req)
}

// doRequest adds the client's headers and token, performs req and turns
// error statuses into *Error.
func (c *Client) doRequest(req *http.Request) (*http.Response, error) {
	for k, v := range c.headers {
		if req.Header.Get(k) == "" {
			req.Header[k] = v
		}
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode < 400 {
		return resp, nil
	}
	defer resp.Body.Close()
	var env ErrorEnvelope
	// An error envelope holds one sentence: more is not agentd's.
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorAnswer))
	if json.Unmarshal(raw, &env) != nil || env.Error.Code == "" {
		// Not agentd's envelope: a proxy or some other server. Its body is
		// not repeated, so pointing an environment at an arbitrary URL
		// cannot be used to read what that URL serves.
		status, _ := codeInfoByStatus(resp.StatusCode)
		return nil, &Error{Status: resp.StatusCode, Code: status, Message: "the server did not answer like agentd", Foreign: true}
	}
	return nil, &Error{Status: resp.StatusCode, Code: env.Error.Code, Message: env.Error.Message}
}

// codeInfoByStatus guesses a code for error responses without an envelope,
// e.g. from a proxy in front of agentd.
func codeInfoByStatus(status int) (string, bool) {
	switch status {
	case http.StatusBadRequest:
		return CodeBadRequest, true
	case http.StatusUnauthorized, http.StatusForbidden:
		return CodeUnauthorized, true
	case http.StatusNotFound:
		return CodeNotFound, true
	case http.StatusRequestEntityTooLarge:
		return CodeTooLarge, true
	case http.StatusTooManyRequests:
		return CodeTooManySessions, true
	case http.StatusServiceUnavailable:
		return CodeShuttingDown, true
	default:
		return CodeInternal, false
	}
}
