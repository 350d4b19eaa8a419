package sn

// UserMentionMax bounds the mentions of one post.
const UserMentionMax = 32

// UserMention (sn-user-mention): the users a post mentions, by name, through
// memcached (unknown names are left out, as DeathStarBench does).
func UserMention(ctx Ctx, in []byte) ([]byte, error) {
	var req struct {
		Op        string   `json:"op"`
		Usernames []string `json:"usernames"`
	}
	if err := decode(in, &req); err != nil {
		return nil, err
	}
	if req.Op != "compose_user_mentions" {
		return nil, badInput("sn-user-mention: unknown op %q", req.Op)
	}
	if len(req.Usernames) > UserMentionMax {
		return nil, badInput("at most %d mentions at once", UserMentionMax)
	}
	names := make([]string, 0, len(req.Usernames))
	for _, n := range req.Usernames {
		if usernameRe.MatchString(n) {
			names = append(names, n)
		}
	}
	users, err := lookupUsers(ctx, names)
	if err != nil {
		return nil, err
	}
	out := make([]Mention, 0, len(users))
	for _, u := range users {
		out = append(out, Mention{UserID: u.UserID, Username: u.Username})
	}
	return reply(out)
}
