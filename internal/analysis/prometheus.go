package analysis

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/prometheus/common/model"

	"github.com/aiinference/operator/internal/outbound"
)

// QueryTimeout bounds each query, on the wire and in Prometheus's evaluation.
const QueryTimeout = 10 * time.Second

// MaxAnswerBytes bounds what is read of one answer. An instant query that
// returns the one number a check needs answers in well under a kilobyte; a
// query that returns thousands of series is wrong anyway, and an endpoint that
// is not a Prometheus must not fill the operator's memory.
const MaxAnswerBytes = 1 << 20

// Querier evaluates an instant PromQL query at a time. An error is shown in the
// check results, hence in status, events and logs: a Querier returns a
// *QueryError for a query it sent, whose text is safe to show.
type Querier interface {
	Query(ctx context.Context, query string, ts time.Time) (model.Value, error)
}

// URLSource says who set the Prometheus URL, and so how much of what it answers
// may be shown. The zero value is the strict one.
type URLSource int

const (
	// ObjectURL is an AIInference's rollout.canary.prometheusURL, set by anyone
	// who may edit the object, and reached with the operator's network access:
	// it may name a service only the operator can reach. Nothing it answers is
	// shown but an HTTP status code and reasons from a fixed set.
	ObjectURL URLSource = iota
	// OperatorURL is the operator's --prometheus-url, set by the cluster admin.
	// Its answers are shown as well: Prometheus's own error message (a PromQL
	// parse error says where the query is wrong) and Go's transport error. That
	// shows users no more than they can learn anyway: a check's query can read
	// any series of that Prometheus, label values too (by regular expression
	// matchers). Still, only a Prometheus error answer's own message is shown:
	// other bodies never are, from either URL.
	OperatorURL
)

// QueryError is why a query has no value, in words safe to show.
type QueryError struct {
	// Reached: a Prometheus API answered (it refused the query, or answered
	// too much). Otherwise the query did not get through, or what answered is not
	// a Prometheus API, and every other query to the URL would fare the same.
	Reached bool
	// Reason is what happened, from a fixed set of texts, the HTTP status code,
	// and, for an OperatorURL only, Prometheus's own error message or Go's
	// transport error.
	Reason string
}

func (e *QueryError) Error() string { return e.Reason }

// Prometheus is a Querier for a Prometheus server's HTTP API.
type Prometheus struct {
	endpoint string // the URL of the instant-query API
	source   URLSource
	timeout  time.Duration
}

// NewPrometheus is a Querier for the Prometheus at rawURL (e.g.
// http://prometheus.monitoring:9090), set as source says, each query bounded by
// QueryTimeout.
func NewPrometheus(rawURL string, source URLSource) (*Prometheus, error) {
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("prometheus URL %q: want an http:// or https:// URL such as http://prometheus.monitoring:9090", rawURL)
	}
	u.Path = strings.TrimRight(u.Path, "/") + "/api/v1/query"
	u.RawPath, u.RawQuery, u.Fragment = "", "", ""
	return &Prometheus{endpoint: u.String(), source: source, timeout: QueryTimeout}, nil
}

// Query implements Querier. Prometheus's warnings are dropped: a query that
// warns still has an answer to judge. Every error is a *QueryError.
func (p *Prometheus) Query(ctx context.Context, query string, ts time.Time) (model.Value, error) {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	form := url.Values{"query": {query}, "timeout": {p.timeout.String()}}
	if !ts.IsZero() {
		form.Set("time", strconv.FormatFloat(float64(ts.Unix())+float64(ts.Nanosecond())/1e9, 'f', -1, 64))
	}
	code, body, err := p.send(ctx, http.MethodPost, form)
	if code == http.StatusForbidden || code == http.StatusMethodNotAllowed || code == http.StatusNotImplemented {
		// A proxy in front of Prometheus that takes only GET (read-only), as
		// Prometheus's own client library allows for.
		code, body, err = p.send(ctx, http.MethodGet, form)
	}
	if err != nil {
		return nil, err
	}
	return p.decode(code, body)
}

// send sends one query with the method and reads the answer, up to
// MaxAnswerBytes. The error is a *QueryError.
func (p *Prometheus) send(ctx context.Context, method string, form url.Values) (code int, body []byte, err error) {
	var req *http.Request
	if method == http.MethodGet {
		req, err = http.NewRequestWithContext(ctx, method, p.endpoint+"?"+form.Encode(), nil)
	} else {
		req, err = http.NewRequestWithContext(ctx, method, p.endpoint, strings.NewReader(form.Encode()))
		if req != nil {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
	}
	if err != nil {
		return 0, nil, p.notSent(err)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := outbound.Client.Do(req)
	if err != nil {
		return 0, nil, p.notSent(err)
	}
	defer resp.Body.Close()
	body, err = io.ReadAll(io.LimitReader(resp.Body, MaxAnswerBytes+1))
	if err != nil {
		return resp.StatusCode, nil, p.notSent(err)
	}
	if len(body) > MaxAnswerBytes {
		return resp.StatusCode, nil, &QueryError{Reached: true, Reason: fmt.Sprintf("the answer is larger than %d MiB, "+
			"not one number: aggregate the query, e.g. with sum() or max()", MaxAnswerBytes>>20)}
	}
	return resp.StatusCode, body, nil
}

// apiErrorTypes are the error types Prometheus's HTTP API answers with, and
// what each means, for an answer whose own message is not shown.
var apiErrorTypes = map[string]string{
	"bad_data":       "the query is not valid PromQL, or a parameter is wrong",
	"execution":      "the query failed while evaluated",
	"timeout":        "the query took longer than " + QueryTimeout.String(),
	"canceled":       "the query was canceled",
	"internal":       "an internal error of Prometheus",
	"unavailable":    "Prometheus is not ready",
	"not_found":      "the API has no such endpoint",
	"not_acceptable": "the API refused the request",
}

// notPrometheus is the reason for an answer that is not one of Prometheus's API.
const notPrometheus = "the answer is not a Prometheus API response"

// decode reads an answer: a value, Prometheus's refusal, or the status code
// of something that is not a Prometheus API. It never returns a piece of body
// but Prometheus's own error message, and that only for an OperatorURL.
func (p *Prometheus) decode(code int, body []byte) (model.Value, error) {
	unusable := func() error {
		switch {
		case code/100 == 2:
			return &QueryError{Reason: notPrometheus}
		case code/100 == 3:
			return &QueryError{Reason: fmt.Sprintf("the URL answered HTTP %d, a redirect, which is not followed", code)}
		default:
			return &QueryError{Reason: fmt.Sprintf("the URL answered HTTP %d", code)}
		}
	}
	var answer struct {
		Status    string          `json:"status"`
		Data      json.RawMessage `json:"data"`
		ErrorType string          `json:"errorType"`
		Error     string          `json:"error"`
	}
	if json.Unmarshal(body, &answer) != nil {
		return nil, unusable()
	}
	switch answer.Status {
	case "error":
		meaning, ok := apiErrorTypes[answer.ErrorType]
		if !ok {
			return nil, unusable()
		}
		if p.source == OperatorURL && answer.Error != "" {
			meaning = truncate(answer.Error, 500)
		}
		return nil, &QueryError{Reached: true, Reason: fmt.Sprintf("Prometheus refused the query (%s: %s)", answer.ErrorType, meaning)}
	case "success":
		if code/100 != 2 {
			return nil, unusable()
		}
	default:
		return nil, unusable()
	}
	var data struct {
		Type   model.ValueType `json:"resultType"` // an unknown type does not decode
		Result json.RawMessage `json:"result"`
	}
	if json.Unmarshal(answer.Data, &data) != nil {
		return nil, unusable()
	}
	var v model.Value
	switch data.Type {
	case model.ValScalar:
		v = &model.Scalar{}
	case model.ValVector:
		v = &model.Vector{}
	case model.ValMatrix:
		v = &model.Matrix{}
	case model.ValString:
		v = &model.String{}
	default:
		return nil, unusable()
	}
	if json.Unmarshal(data.Result, v) != nil {
		return nil, unusable()
	}
	// Vectors and matrices as the client library gives them: not pointers.
	switch x := v.(type) {
	case *model.Vector:
		v = *x
	case *model.Matrix:
		v = *x
	}
	return v, nil
}

// notSent is why a request got no answer. For an ObjectURL it is a reason from
// a fixed set: Go's errors quote what the other end sent when it is not HTTP
// (a service's banner) and the names in a TLS certificate.
func (p *Prometheus) notSent(err error) error {
	if p.source == OperatorURL {
		return &QueryError{Reason: err.Error()}
	}
	var (
		dns      *net.DNSError
		verify   *tls.CertificateVerificationError
		hostname x509.HostnameError
		unknown  x509.UnknownAuthorityError
		invalid  x509.CertificateInvalidError
		record   tls.RecordHeaderError
		netErr   net.Error
	)
	reason := "the request failed"
	switch {
	case errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &netErr) && netErr.Timeout()):
		reason = "no answer within " + p.timeout.String()
	case errors.Is(err, context.Canceled):
		reason = "the query was canceled"
	case errors.As(err, &dns):
		reason = "DNS lookup of the host failed"
		if dns.IsNotFound {
			reason = "no such host"
		}
	case errors.Is(err, syscall.ECONNREFUSED):
		reason = "connection refused"
	case errors.As(err, &verify) || errors.As(err, &hostname) || errors.As(err, &unknown) || errors.As(err, &invalid):
		reason = "TLS: the server's certificate is not trusted, or not valid for the host"
	case errors.As(err, &record):
		reason = "TLS: the server does not speak TLS"
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET):
		reason = "the connection closed before a whole answer"
	}
	return &QueryError{Reason: reason}
}

// truncate cuts s to at most n bytes, on a rune boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}
