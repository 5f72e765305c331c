package analysis

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// Prometheus's answers, as its HTTP API gives them, are read into values; a
// proxy that refuses POST gets the query again as a GET.
func TestPrometheusReadsItsAnswers(t *testing.T) {
	const vector = `{"status":"success","data":{"resultType":"vector","result":[{"metric":{"pod":"a"},"value":[1777636800,"0.25"]}]},"warnings":["w"]}`
	for _, tc := range []struct {
		name     string
		postCode int // what a POST is answered with, when not the answer
		answer   string
		want     float64
		wantGETs int
	}{
		{name: "a vector", answer: vector, want: 0.25},
		{name: "a scalar", answer: `{"status":"success","data":{"resultType":"scalar","result":[1777636800,"3"]}}`, want: 3},
		{name: "GET after a 405 to POST", postCode: http.StatusMethodNotAllowed, answer: vector, want: 0.25, wantGETs: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gets := 0
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/prom/api/v1/query" {
					http.NotFound(w, r)
					return
				}
				if r.Method == http.MethodPost && tc.postCode != 0 {
					w.WriteHeader(tc.postCode)
					return
				}
				if r.Method == http.MethodGet {
					gets++
				}
				if err := r.ParseForm(); err != nil || r.Form.Get("query") != "up" || r.Form.Get("time") != "1777636800.5" ||
					r.Form.Get("timeout") != "10s" {
					t.Errorf("%s %s with form %v", r.Method, r.URL, r.Form)
				}
				w.Header().Set("Content-Type", "application/json")
				io.WriteString(w, tc.answer)
			}))
			defer srv.Close()
			q, err := NewPrometheus(srv.URL+"/prom/", ObjectURL)
			if err != nil {
				t.Fatal(err)
			}
			v, err := q.Query(context.Background(), "up", time.Unix(1777636800, 5e8))
			f, err := single(v, err)
			if err != nil || f != tc.want {
				t.Errorf("value %v, %v; want %v", f, err, tc.want)
			}
			if gets != tc.wantGETs {
				t.Errorf("%d GET requests, want %d", gets, tc.wantGETs)
			}
		})
	}
}
