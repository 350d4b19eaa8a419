// Package sn is the SocialNetwork application (DeathStarBench's design,
// ported to Staccato): every service's handler, written once against Ctx so
// that the same code runs as a Staccato function (*staccato.Context is a
// Ctx) and inside the RPC-server shell of cmd/rpcserver.
package sn

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
)

// Ctx is what a handler needs from whatever hosts it: calls to the other
// services, a log, and a Go context carrying the call's deadline.
type Ctx interface {
	Call(name string, in []byte) ([]byte, error)
	Logf(format string, args ...any)
	GoContext() context.Context
}

// Handler is one service: JSON in, JSON out.
type Handler func(ctx Ctx, in []byte) ([]byte, error)

// Service names: a function's name under Staccato, a path under the RPC
// servers.
const (
	SvcComposePost  = "sn-compose-post"
	SvcText         = "sn-text"
	SvcURLShorten   = "sn-url-shorten"
	SvcUserMention  = "sn-user-mention"
	SvcUser         = "sn-user"
	SvcMedia        = "sn-media"
	SvcUniqueID     = "sn-unique-id"
	SvcPostStorage  = "sn-post-storage"
	SvcUserTimeline = "sn-user-timeline"
	SvcHomeTimeline = "sn-home-timeline"
	SvcSocialGraph  = "sn-social-graph"

	// The frontend: one function per API (DeathStarBench's nginx routes).
	APIPostCompose      = "sn-post-compose"
	APIHomeTimelineRead = "sn-home-timeline-read"
	APIUserTimelineRead = "sn-user-timeline-read"
	APIUserFollow       = "sn-user-follow"
	APIUserRegister     = "sn-user-register"
	APIUserLogin        = "sn-user-login"
)

// Handlers are the services written in Go, by name (sn-text and sn-media
// are Python: python/).
var Handlers = map[string]Handler{
	SvcComposePost:      ComposePost,
	SvcURLShorten:       URLShorten,
	SvcUserMention:      UserMention,
	SvcUser:             User,
	SvcUniqueID:         UniqueID,
	SvcPostStorage:      PostStorage,
	SvcUserTimeline:     UserTimeline,
	SvcHomeTimeline:     HomeTimeline,
	SvcSocialGraph:      SocialGraph,
	APIPostCompose:      PostComposeAPI,
	APIHomeTimelineRead: HomeTimelineReadAPI,
	APIUserTimelineRead: UserTimelineReadAPI,
	APIUserFollow:       UserFollowAPI,
	APIUserRegister:     UserRegisterAPI,
	APIUserLogin:        UserLoginAPI,
}

// BadInput is a request the service refuses: its message says what is
// wrong, and it is not retried.
type BadInput struct{ Msg string }

func (e *BadInput) Error() string { return e.Msg }

func badInput(format string, args ...any) error {
	return &BadInput{Msg: fmt.Sprintf(format, args...)}
}

// decode reads a request, refusing unknown fields (a misspelt field would
// otherwise be silently zero).
func decode(in []byte, v any) error {
	if err := strictUnmarshal(in, v); err != nil {
		return badInput("bad request: %v", err)
	}
	return nil
}

// call sends req to service name as JSON and decodes its answer into resp
// (nil: the answer is ignored).
func call(ctx Ctx, name string, req any, resp any) error {
	in, err := json.Marshal(req)
	if err != nil {
		return err
	}
	out, err := ctx.Call(name, in)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if resp == nil {
		return nil
	}
	if err := json.Unmarshal(out, resp); err != nil {
		return fmt.Errorf("%s answered %q: %w", name, truncate(out, 200), err)
	}
	return nil
}

func reply(v any) ([]byte, error) { return json.Marshal(v) }

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "..."
	}
	return string(b)
}

// parallel runs fns at once and returns the first error (all are waited
// for: a call is never left running behind its caller's answer).
func parallel(fns ...func() error) error {
	errs := make(chan error, len(fns))
	for _, f := range fns[1:] {
		go func(f func() error) { errs <- f() }(f)
	}
	first := fns[0]()
	for range fns[1:] {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// IsBadInput tells a refused request from a failure.
func IsBadInput(err error) bool {
	var b *BadInput
	return errors.As(err, &b)
}
