package analysis

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// The hostile-endpoint tests point the analysis at endpoints that are not a
// Prometheus, as anyone who may edit an AIInference can with
// rollout.canary.prometheusURL: pages and services only the operator can reach.
// Nothing of what they answer may reach a check's result (which status, events
// and logs repeat) beyond an HTTP status code and a reason from a fixed set,
// and no request may carry a credential of the operator's.

// secret stands for what an endpoint only the operator can reach would give away.
const secret = "s3cr3t-b0dy-7f1c"

// testCA is a certificate authority the test process trusts (SSL_CERT_FILE is
// set in TestMain, before anything loads the system roots) so that a TLS
// endpoint can complete a handshake and show what the client sent in it.
var testCA *x509.Certificate

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "analysis-ca-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	testCA, caKey = newCert(nil, nil, pkix.Name{CommonName: "analysis test CA"}, nil, nil)
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: testCA.Raw}), 0o600); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Setenv("SSL_CERT_FILE", caFile)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

var caKey *ecdsa.PrivateKey

// newCert makes a certificate for the names, signed by parent (self-signed,
// and a CA, when parent is nil).
func newCert(parent *x509.Certificate, parentKey *ecdsa.PrivateKey, subject pkix.Name, dnsNames []string, ips []net.IP) (*x509.Certificate, *ecdsa.PrivateKey) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      subject,
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		DNSNames:     dnsNames,
		IPAddresses:  ips,
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	signer, signerKey := tmpl, key
	if parent == nil {
		tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
	} else {
		signer, signerKey = parent, parentKey
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		panic(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		panic(err)
	}
	return cert, key
}

// seen is what an endpoint saw of the requests sent to it.
type seen struct {
	mu          sync.Mutex
	requests    int
	credentials []string // credential headers and client certificates received
	written     int64    // body bytes the endpoint managed to write
}

func (s *seen) record(r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests++
	for _, h := range []string{"Authorization", "Proxy-Authorization", "Cookie"} {
		if v := r.Header.Get(h); v != "" {
			s.credentials = append(s.credentials, h+": "+v)
		}
	}
	if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
		s.credentials = append(s.credentials, "client certificate "+r.TLS.PeerCertificates[0].Subject.String())
	}
}

func (s *seen) wrote(n int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.written += n
}

func (s *seen) get() (requests int, credentials []string, written int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests, append([]string(nil), s.credentials...), s.written
}

// hugeAnswer is the size of the huge body: far more than a querier should read.
const hugeAnswer = 64 << 20

func TestHostileEndpoints(t *testing.T) {
	jsonAnswer := func(code int, body string) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			io.WriteString(w, body)
		}
	}

	type endpoint struct {
		// url of the endpoint; seen, what it saw.
		url  string
		seen *seen
		// behind, when set, is what a service the endpoint redirects to saw.
		behind *seen
	}
	// serve starts an HTTP endpoint answering with h, recording every request.
	serve := func(t *testing.T, h http.HandlerFunc) endpoint {
		s := &seen{}
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			s.record(r)
			h(w, r)
		}))
		t.Cleanup(srv.Close)
		return endpoint{url: srv.URL, seen: s}
	}
	// serveTLS starts an HTTPS endpoint with a certificate for names, signed by
	// the test CA, that asks for a client certificate.
	serveTLS := func(t *testing.T, dnsNames []string, h http.HandlerFunc) endpoint {
		cert, key := newCert(testCA, caKey, pkix.Name{CommonName: "endpoint"}, dnsNames, nil)
		s := &seen{}
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			s.record(r)
			h(w, r)
		}))
		srv.TLS = &tls.Config{
			Certificates: []tls.Certificate{{Certificate: [][]byte{cert.Raw}, PrivateKey: key, Leaf: cert}},
			ClientAuth:   tls.RequestClientCert,
		}
		srv.StartTLS()
		t.Cleanup(srv.Close)
		_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
		return endpoint{url: "https://localhost:" + port, seen: s}
	}

	for _, tc := range []struct {
		name  string
		start func(t *testing.T) endpoint
		// want is in every check's message, for the object's URL.
		want string
		// operatorSees: the operator's own --prometheus-url shows the secret
		// (Prometheus's own error message, Go's transport error); the object's
		// URL never does.
		operatorSees bool
		// mustReach: the requests must get through, to show what they carry.
		mustReach bool
	}{
		{name: "an HTML page", mustReach: true, want: "not a Prometheus API response", start: func(t *testing.T) endpoint {
			return serve(t, func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "text/html")
				fmt.Fprintf(w, "<html><body><h1>Admin console</h1><p>token: %s</p></body></html>", secret)
			})
		}},
		{name: "a body that is not JSON", want: "not a Prometheus API response", start: func(t *testing.T) endpoint {
			return serve(t, func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, secret) })
		}},
		{name: "a 500 with a secret body", want: "answered HTTP 500", start: func(t *testing.T) endpoint {
			return serve(t, func(w http.ResponseWriter, _ *http.Request) {
				http.Error(w, "internal error: "+secret, http.StatusInternalServerError)
			})
		}},
		{name: "a 404 with a secret body", want: "answered HTTP 404", start: func(t *testing.T) endpoint {
			return serve(t, func(w http.ResponseWriter, _ *http.Request) {
				http.Error(w, "no route; see "+secret, http.StatusNotFound)
			})
		}},
		{name: "a 400 that is not Prometheus's", want: "answered HTTP 400", start: func(t *testing.T) endpoint {
			return serve(t, func(w http.ResponseWriter, _ *http.Request) {
				http.Error(w, secret, http.StatusBadRequest)
			})
		}},
		{name: "JSON with status error and a secret message", want: "Prometheus refused the query (execution",
			operatorSees: true, start: func(t *testing.T) endpoint {
				return serve(t, jsonAnswer(http.StatusUnprocessableEntity,
					fmt.Sprintf(`{"status":"error","errorType":"execution","error":%q}`, secret)))
			}},
		{name: "JSON with status error and a secret error type", want: "not a Prometheus API response", start: func(t *testing.T) endpoint {
			return serve(t, jsonAnswer(http.StatusOK, fmt.Sprintf(`{"status":"error","errorType":%q,"error":"x"}`, secret)))
		}},
		{name: "JSON with a secret result type", want: "not a Prometheus API response", start: func(t *testing.T) endpoint {
			return serve(t, jsonAnswer(http.StatusOK, fmt.Sprintf(`{"status":"success","data":{"resultType":%q,"result":[]}}`, secret)))
		}},
		{name: "JSON with a secret sample value", want: "not a Prometheus API response", start: func(t *testing.T) endpoint {
			return serve(t, jsonAnswer(http.StatusOK,
				fmt.Sprintf(`{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,%q]}]}}`, secret)))
		}},
		{name: "a redirect to a service only the operator reaches", want: "answered HTTP 302", start: func(t *testing.T) endpoint {
			// internal stands for a service only the operator can reach.
			internal := serve(t, jsonAnswer(http.StatusBadRequest,
				fmt.Sprintf(`{"status":"error","errorType":"bad_data","error":%q}`, secret)))
			e := serve(t, func(w http.ResponseWriter, r *http.Request) {
				http.Redirect(w, r, internal.url+"/api/v1/query?"+r.URL.RawQuery+"&from="+secret, http.StatusFound)
			})
			e.behind = internal.seen
			return e
		}},
		{name: "a huge body", want: "larger than", start: func(t *testing.T) endpoint {
			var e endpoint
			e = serve(t, func(w http.ResponseWriter, _ *http.Request) {
				// Valid JSON all along: whitespace, then a secret never reached.
				chunk := []byte(strings.Repeat(" ", 64<<10))
				for n := 0; n < hugeAnswer; n += len(chunk) {
					m, err := w.Write(chunk)
					e.seen.wrote(int64(m))
					if err != nil {
						return
					}
				}
				fmt.Fprintf(w, `{"status":"error","errorType":"bad_data","error":%q}`, secret)
			})
			return e
		}},
		{name: "a service that does not speak HTTP", want: "Prometheus is unreachable", operatorSees: true, start: func(t *testing.T) endpoint {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close() })
			go func() {
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					fmt.Fprintf(c, "SSH-2.0-%s\r\n", secret)
					c.Close()
				}
			}()
			return endpoint{url: "http://" + l.Addr().String(), seen: &seen{}}
		}},
		{name: "a TLS certificate for a secret name", want: "TLS", operatorSees: true, start: func(t *testing.T) endpoint {
			return serveTLS(t, []string{secret + ".internal"}, jsonAnswer(http.StatusOK, `{}`))
		}},
		{name: "HTTPS asking for a client certificate", want: "not a Prometheus API response", mustReach: true, start: func(t *testing.T) endpoint {
			return serveTLS(t, []string{"localhost"}, func(w http.ResponseWriter, _ *http.Request) {
				fmt.Fprintf(w, "<html>%s</html>", secret)
			})
		}},
	} {
		for _, operator := range []bool{false, true} {
			name := tc.name + "/object's URL"
			if operator {
				name = tc.name + "/operator's URL"
			}
			t.Run(name, func(t *testing.T) {
				e := tc.start(t)
				q, err := newTestPrometheus(e.url, operator)
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				// A check with a query of its own, and a built-in one.
				req := request(servingv1.EngineVLLM,
					servingv1.AnalysisCheck{Name: "mine", Query: `sum(up{{{selector}}})`, Max: "1"},
					servingv1.AnalysisCheck{Name: "ttft", Metric: servingv1.MetricTimeToFirstToken, Max: "1"})
				begin := time.Now()
				run := Run(ctx, q, req)
				took := time.Since(begin)
				_, queryErr := q.Query(ctx, "up", now)
				all := fmt.Sprintf("%+v\n%v", run, queryErr)
				t.Logf("run took %s; %s: %q", took.Round(time.Millisecond), run.Checks[0].Name, run.Checks[0].Message)

				if run.Verdict != servingv1.VerdictInconclusive {
					t.Errorf("verdict %s, want Inconclusive", run.Verdict)
				}
				leaked := strings.Contains(all, secret)
				switch {
				case !operator && leaked:
					t.Errorf("the answer of the object's URL leaked into the result: %s", all)
				case operator && leaked && !tc.operatorSees:
					t.Errorf("the answer leaked into the result: %s", all)
				case operator && !leaked && tc.operatorSees:
					t.Errorf("Prometheus's own message is not shown for the operator's URL: %s", all)
				}
				for _, c := range run.Checks {
					if !operator && !strings.Contains(c.Message, tc.want) {
						t.Errorf("%s: message %q, want it to say %q", c.Name, c.Message, tc.want)
					}
				}
				requests, credentials, written := e.seen.get()
				if len(credentials) > 0 {
					t.Errorf("the requests carried credentials: %q", credentials)
				}
				if e.behind != nil {
					if n, creds, _ := e.behind.get(); n > 0 {
						t.Errorf("a redirect was followed: the service behind it got %d requests (credentials %q)", n, creds)
					}
				}
				if tc.mustReach && requests == 0 {
					t.Errorf("no request reached the endpoint, so what it saw of them proves nothing")
				}
				if written > 16<<20 {
					t.Errorf("the endpoint wrote %d MiB before the querier stopped reading, want at most 16 MiB", written>>20)
				}
			})
		}
	}
}

// newTestPrometheus is the querier the controller makes for the URL: the
// operator's own, or an object's.
func newTestPrometheus(u string, operator bool) (Querier, error) {
	if operator {
		return NewPrometheus(u, OperatorURL)
	}
	return NewPrometheus(u, ObjectURL)
}
