package sn

import (
	"crypto/rand"
	"fmt"
	"net/url"
)

// URLShortenMax bounds the URLs of one post.
const URLShortenMax = 32

// ShortURLPrefix starts every short URL.
const ShortURLPrefix = "http://short-url.local/"

// URLShorten (sn-url-shorten): compose_urls gives each URL a random short
// form and stores the pairs (PostgreSQL's urls table); get_extended_urls
// maps short forms back.
func URLShorten(ctx Ctx, in []byte) ([]byte, error) {
	var req struct {
		Op   string   `json:"op"`
		URLs []string `json:"urls"`
	}
	if err := decode(in, &req); err != nil {
		return nil, err
	}
	if len(req.URLs) > URLShortenMax {
		return nil, badInput("at most %d URLs at once", URLShortenMax)
	}
	switch req.Op {
	case "compose_urls":
		return composeURLs(ctx, req.URLs)
	case "get_extended_urls":
		return extendedURLs(ctx, req.URLs)
	}
	return nil, badInput("sn-url-shorten: unknown op %q", req.Op)
}

const shortAlphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"

func shortName() string {
	var b [10]byte
	_, _ = rand.Read(b[:])
	for i := range b {
		b[i] = shortAlphabet[int(b[i])%len(shortAlphabet)]
	}
	return string(b[:])
}

func composeURLs(ctx Ctx, urls []string) ([]byte, error) {
	out := make([]URL, 0, len(urls))
	if len(urls) == 0 {
		return reply(out)
	}
	short := make([]string, 0, len(urls))
	for _, u := range urls {
		if p, err := url.Parse(u); err != nil || (p.Scheme != "http" && p.Scheme != "https") || len(u) > 2048 {
			return nil, badInput("not an http(s) URL: %q", truncate([]byte(u), 100))
		}
		s := ShortURLPrefix + shortName()
		short = append(short, s)
		out = append(out, URL{Shortened: s, Expanded: u})
	}
	db, err := pg(ctx.GoContext())
	if err != nil {
		return nil, err
	}
	_, err = db.Exec(ctx.GoContext(),
		`INSERT INTO urls (short_url, expanded_url) SELECT * FROM unnest($1::text[], $2::text[])`, short, urls)
	if err != nil {
		return nil, fmt.Errorf("storing URLs: %w", err)
	}
	return reply(out)
}

func extendedURLs(ctx Ctx, short []string) ([]byte, error) {
	db, err := pg(ctx.GoContext())
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx.GoContext(), `SELECT short_url, expanded_url FROM urls WHERE short_url = ANY($1)`, short)
	if err != nil {
		return nil, fmt.Errorf("reading URLs: %w", err)
	}
	defer rows.Close()
	m := map[string]string{}
	for rows.Next() {
		var s, e string
		if err := rows.Scan(&s, &e); err != nil {
			return nil, err
		}
		m[s] = e
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	out := make([]URL, 0, len(short))
	for _, s := range short {
		if e, ok := m[s]; ok {
			out = append(out, URL{Shortened: s, Expanded: e})
		}
	}
	return reply(out)
}
